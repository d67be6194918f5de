"""The run explorer's page on synthetic runs: what the HTML holds (the embedded data, escaping, no external
URL, determinism) and, in headless Chromium, what a reader sees (lazy list, filters, diffs, plots, hostile
text kept as text)."""

from __future__ import annotations

import copy
import json
import re

import pytest

from rlbench.explorer.render import render_page, write_page
from support.browser import BOX, chromium_or_skip, coloured_pixels, dark_pixels
from support.run_pages import synthetic_page_data

EMBEDDED = re.compile(r'<script type="application/json" id="run-data">(.*?)</script>', re.S)
HOSTILE = '</script><img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'


def embedded(page: str) -> dict:
    (text,) = EMBEDDED.findall(page)
    return json.loads(text)


def test_the_page_embeds_its_data_whole_and_escaped_and_is_deterministic():
    data = synthetic_page_data(turns=50, submissions=5, hours=1)
    data["turns"][0]["messages"][0]["text"] = HOSTILE + " \u2028 & done"
    data["title"] = "<b>gsm8k</b>"
    page = render_page(data)
    assert embedded(page) == data  # the data round-trips
    assert page.count("</script>") == 2 and "<img" not in page  # nothing in the data ends the script element
    assert "<title>run: &lt;b&gt;gsm8k&lt;/b&gt;</title>" in page
    assert render_page(copy.deepcopy(data)) == page


def test_a_nan_or_infinity_in_the_records_becomes_null():
    data = synthetic_page_data(turns=20, submissions=3, hours=1)
    data["submissions"][0]["score"], data["resources"]["cpu_percent"][0] = float("nan"), float("inf")
    shown = embedded(render_page(data))
    assert shown["submissions"][0]["score"] is None and shown["resources"]["cpu_percent"][0] is None
    assert shown["submissions"][1] == data["submissions"][1]


def test_the_page_needs_nothing_from_outside():
    page = render_page(synthetic_page_data(turns=20, submissions=3, hours=1))
    without_data = EMBEDDED.sub("", page)
    assert "http://" not in without_data and "https://" not in without_data and " src=" not in without_data


def test_write_page_replaces_a_page_whole(tmp_path):
    path = write_page(tmp_path / "reports" / "run.html", synthetic_page_data(turns=10, submissions=2, hours=1))
    assert path.is_file() and embedded(path.read_text())["title"].startswith("gsm8k")
    assert [p.name for p in path.parent.iterdir()] == ["run.html"]  # no temporary file left


def _open(browser, tmp_path, data, name="run.html"):
    page = write_page(tmp_path / name, data)
    browser.open(page.as_uri())
    browser.wait_for("window.runPage && window.runPage.ready === true")


@pytest.mark.browser
def test_a_synthetic_run_in_chromium(tmp_path):
    from rlbench.analysis.browser import Page

    chromium_or_skip()
    data = synthetic_page_data(turns=300, submissions=12, hours=2, seed=1)
    data["submissions"][3]["diff"], data["submissions"][3]["diff_against"] = "", 3
    data["submissions"][4]["diff"] = None
    data["turns"][5]["label"] = "<b>x</b>"
    data["turns"][6]["messages"][0]["text"] = HOSTILE
    turns = data["turns"]
    with Page(width=1280, height=1400) as browser:
        _open(browser, tmp_path, data)
        every = [t["i"] for t in turns]
        assert browser.evaluate("window.runPage.filtered.slice()") == every
        rows = browser.evaluate("document.querySelectorAll('#turns .turn-row').length")
        assert 0 < rows < 60  # only the rows in view (and a margin) are built
        browser.evaluate(f"window.runPage.scrollToTurn({every[-1]})")
        shown = browser.evaluate("Array.from(document.querySelectorAll('#turns .turn-row')).map(r => Number(r.dataset.i))")
        assert every[-1] in shown and every[0] not in shown

        def set_filter(selector, js_value, event):
            browser.evaluate(f"(e => {{ {js_value}; e.dispatchEvent(new Event('{event}', {{bubbles: true}})); }})"
                             f"(document.querySelector('{selector}'))")

        word = turns[10]["response"][0]["text"].split()[0]
        set_filter("#filter-text", f"e.value = {json.dumps(word.upper())}", "input")  # case-insensitive
        texts = {t["i"]: "\n".join([t["label"], *(m["text"] for m in t["messages"] + t["response"])]).lower() for t in turns}
        assert browser.evaluate("window.runPage.filtered.slice()") == [i for i in every if word in texts[i]]
        set_filter("#filter-text", "e.value = ''", "input")
        set_filter("#filter-tool", "e.value = 'Edit'", "change")
        assert browser.evaluate("window.runPage.filtered.slice()") == [t["i"] for t in turns if "Edit" in t["tools"]]
        set_filter("#filter-errors", "e.checked = true", "change")
        errors = [t["i"] for t in turns if "Edit" in t["tools"] and (not t["ok"] or any(m.get("error") for m in t["messages"]))]
        assert browser.evaluate("window.runPage.filtered.slice()") == errors
        count = browser.evaluate("document.querySelector('#turn-count').textContent")
        assert count.startswith(f"{len(errors)} of {len(turns)}")
        set_filter("#filter-tool", "e.value = ''", "change")
        set_filter("#filter-errors", "e.checked = false", "change")

        # Submissions: every one listed; a diff, an unchanged code and no code at all.
        ids = browser.evaluate("Array.from(document.querySelectorAll('#submissions .submission-row')).map(r => r.dataset.id)")
        assert ids == [str(s["id"]) for s in data["submissions"]]

        def detail(sid):
            browser.evaluate(f"document.querySelector('#submissions .submission-row[data-id=\"{sid}\"]').click()")
            return browser.evaluate("document.querySelector('#submission-detail').textContent")

        assert "+lr = " in detail(data["submissions"][1]["id"])
        assert browser.evaluate("document.querySelectorAll('#submission-detail .diff .add').length") == 1
        assert browser.evaluate("document.querySelectorAll('#submission-detail .diff .del').length") == 1
        assert "no code change since submission 3" in detail(data["submissions"][3]["id"])
        assert "no code recorded for this submission" in detail(data["submissions"][4]["id"])

        # Hostile text stays text: nothing ran, the tags are shown.
        browser.evaluate("window.runPage.scrollToTurn(5)")
        label = browser.evaluate("document.querySelector('#turns .turn-row[data-i=\"5\"]').textContent")
        assert "<b>x</b>" in label
        browser.evaluate("window.runPage.selectTurn(6)")
        assert HOSTILE in browser.evaluate("document.querySelector('#turn-detail').textContent")
        assert browser.evaluate("typeof window.pwned") == "undefined"

        # The summary's iterations: its columns in summary.jsonl's order, one row per iteration.
        head = browser.evaluate("Array.from(document.querySelectorAll('#iterations th')).map(e => e.textContent)")
        assert head == ["iteration", "since_start_s", "status", "score", "what_was_done", "why"]
        assert browser.evaluate("document.querySelectorAll('#iterations tbody tr').length") == len(data["submissions"])

        # The plots are drawn; no page errors.
        shot = browser.screenshot(tmp_path / "synthetic.png")
        for canvas in ("#timeline", "#resources"):
            box = browser.evaluate(BOX % f"document.querySelector('{canvas}')")
            assert coloured_pixels(shot, box) > 200, canvas
        assert browser.errors == [], browser.errors

        # A run without a resource trace, summary or turns still gets a page that says so.
        bare = synthetic_page_data(turns=0, submissions=0, hours=1)
        bare.update(resources=None, summary=None, final=None)
        _open(browser, tmp_path, bare, "bare.html")
        shot = browser.screenshot(tmp_path / "bare.png")
        box = browser.evaluate(BOX % "document.querySelector('#resources')")
        assert dark_pixels(shot, box) > 20  # the words "no resource trace"
        assert browser.evaluate("document.querySelector('#iterations').textContent") == "no summary"
        assert browser.evaluate("document.querySelector('#submissions').textContent") == "no submissions"
        assert browser.evaluate("document.querySelector('#turn-count').textContent").startswith("0 of 0")
        assert browser.errors == [], browser.errors
