"""Prompt-lookup drafts for greedy decoding: the tokens that followed the latest earlier occurrence
of the text's last n-gram, proposed as the next tokens and checked in one forward. A generator keeps
every draft token that equals the greedy choice at its position and the greedy token after the
last kept one, so the output is the greedy decoding's own and a draft only saves forwards (a
completion copied from its prompt, or repeating itself, costs one forward per run of matching
tokens instead of one per token).
"""

from __future__ import annotations

import array

#: the longest n-gram looked up (each generator sets how many draft tokens it feeds)
DRAFT_NGRAM = 3


def lookup_draft(tokens: tuple, limit: int, max_ngram: int = DRAFT_NGRAM) -> list[int]:
    """Up to `limit` tokens that followed the latest earlier occurrence of the longest (<= max_ngram)
    n-gram ending `tokens` ([] when none occurs earlier). A continuation that reaches the end of
    `tokens` goes on copying what it has drafted (an overlapping copy): text repeating itself with
    period p drafts the next `limit` tokens of that repetition, not only the p tokens seen."""
    if limit <= 0 or len(tokens) < 2:
        return []
    buffer = array.array("q", tokens).tobytes()
    width = array.array("q").itemsize
    end = (len(tokens) - 1) * width  # an occurrence must end before the last token
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        pattern = buffer[-n * width :]
        found = buffer.rfind(pattern, 0, end)
        while found > 0 and found % width:  # byte matches across token boundaries do not count
            found = buffer.rfind(pattern, 0, found + len(pattern) - 1)
        if found >= 0 and found % width == 0:
            start = found // width + n
            draft = list(tokens[start : start + limit])
            period = len(draft)  # when short of `limit`, the slice ran to the end of `tokens`
            while len(draft) < limit:
                draft.append(draft[len(draft) - period])
            return draft
    return []
