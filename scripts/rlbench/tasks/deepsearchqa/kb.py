"""The offline knowledge base of DeepSearchQA: fictional entities, their pages, and multi-hop
questions generated from their facts.

Every name is invented by a syllable generator, so no question can be answered from what a model
learned in pretraining: the facts are only in the pages, and a model must find them with the
search tool. The world has six kinds of entities, each with one page of plain sentences that
state its facts and name the entities it is linked to:

- countries (a region, a capital, an independence year, their cities);
- cities (a country, a founding year, a population, the companies headquartered and the people
  born there);
- people (a birth year and city, a profession, an employer, the company they founded, the award
  they received and the year, the works they created);
- companies (an industry, a headquarters city, a founder, a founding year);
- awards (the country and year they were established in, their recipients with years);
- works (a kind, a creator, a year).

Questions follow DeepSearchQA's two answer types: "Single Answer" (one value reached through
two or three hops, e.g. the birth country of a company's founder) and "Set Answer" (every entity
that meets a combination of conditions, e.g. the companies of a city founded by people born in a
country), including a few set questions that no entity meets (gold "None", as the four such rows
of the real dataset). Every question is unambiguous: names are unique (no name contains another),
each single question's chain has exactly one value, and a set question's gold is the complete set.

The knowledge base is public (built from data_seed; every workspace gets its pages); the
training questions come from data_seed, the held-out ones from the installation's salted seed,
never asking what a training question asks about the same entity (template and anchor).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from rlbench.tasks.deepsearchqa.public import NONE_ANSWER, SET, SINGLE

#: The share of questions whose gold set is empty ("a few percent"; the dataset has 4 of 900).
EMPTY_FRACTION = 0.03
#: The share of single-answer questions (the dataset: about 35 %).
SINGLE_FRACTION = 0.35
#: The largest gold set a set question may have (the answer must fit a short answer[...]).
MAX_SET_SIZE = 6

_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "th",
    "br",
    "dr",
    "kr",
    "tr",
    "gl",
    "st",
    "sh",
]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "m", "k", "v"]
_REGION_KINDS = ["Coast", "Highlands", "Basin", "Isles", "Steppe", "Marches"]
_CITY_ENDINGS = ["", "", "port", "holm", "dell", "mora", "vik", "grad"]
_COMPANY_SUFFIXES = ["Works", "Systems", "Holdings", "Labs", "Industries", "Group", "Foundry", "Collective"]
_AWARD_KINDS = ["Prize", "Medal", "Award", "Laurel"]
_WORK_NOUNS = [
    "Chronicle",
    "Nocturne",
    "Atlas",
    "Letters",
    "Garden",
    "Tides",
    "Lantern",
    "Orchard",
    "Requiem",
    "Meridian",
]
PROFESSIONS = {  # singular -> plural (set questions name them in the plural)
    "architect": "architects",
    "chemist": "chemists",
    "novelist": "novelists",
    "engineer": "engineers",
    "economist": "economists",
    "painter": "painters",
    "physicist": "physicists",
    "composer": "composers",
    "journalist": "journalists",
    "surgeon": "surgeons",
    "historian": "historians",
    "sculptor": "sculptors",
}
INDUSTRIES = [
    "shipbuilding",
    "software",
    "textiles",
    "pharmaceuticals",
    "publishing",
    "aviation",
    "mining",
    "banking",
    "agriculture",
    "robotics",
]
WORK_KINDS = {  # the creator's profession -> what they create
    "novelist": "novel",
    "composer": "symphony",
    "painter": "painting",
    "historian": "history book",
    "journalist": "essay collection",
    "sculptor": "sculpture",
    "architect": "building design",
}

CATEGORIES = {
    "business": "Business & Economy",
    "geography": "Geography",
    "arts": "Arts & Culture",
    "history": "History",
    "awards": "Awards & Honours",
    "people": "People & Society",
}


@dataclass
class KnowledgeBase:
    """The fictional world: entities by kind (name -> facts) and one page per entity."""

    seed: int
    regions: list[str]
    countries: dict[str, dict] = field(default_factory=dict)
    cities: dict[str, dict] = field(default_factory=dict)
    people: dict[str, dict] = field(default_factory=dict)
    companies: dict[str, dict] = field(default_factory=dict)
    awards: dict[str, dict] = field(default_factory=dict)
    works: dict[str, dict] = field(default_factory=dict)
    pages: list[dict] = field(default_factory=list)

    def country_of(self, city: str) -> str:
        return self.cities[city]["country"]

    def birth_country(self, person: str) -> str:
        return self.country_of(self.people[person]["birth_city"])


class _Names:
    """Unique invented names: none equals, contains or is contained in another (case-insensitive),
    so that a name found in an answer can only mean one entity."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.taken: list[str] = []

    def word(self, syllables: tuple[int, int] = (2, 3)) -> str:
        count = self.rng.randint(*syllables)
        parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(count)]
        return ("".join(parts) + self.rng.choice(_CODAS)).capitalize()

    def unique(self, make) -> str:
        """The first name `make()` draws that clashes with no earlier one."""
        for _ in range(10_000):
            name = make()
            low = name.lower()
            if not any(low in other or other in low for other in self.taken):
                self.taken.append(low)
                return name
        raise RuntimeError("could not draw a unique name; the name generator is exhausted")


def _counts(n_entities: int) -> dict[str, int]:
    """Entities per kind for a knowledge base of about n_entities pages (people take the rest)."""
    shares = {
        "countries": (0.025, 2),
        "cities": (0.1, 3),
        "awards": (0.025, 2),
        "companies": (0.16, 3),
        "works": (0.16, 2),
    }
    counts = {kind: max(low, round(n_entities * share)) for kind, (share, low) in shares.items()}
    counts["people"] = max(5, n_entities - sum(counts.values()))
    return counts


def _join(names: list[str]) -> str:
    """ "A", "A and B", "A, B and C": how a page lists linked entities."""
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def build_kb(data_seed: int, n_entities: int = 400) -> KnowledgeBase:
    """The knowledge base of `data_seed`: the same world for the same seed and size, always."""
    if n_entities < 20:
        raise ValueError(f"kb_size must be at least 20 entities; got {n_entities}")
    rng = random.Random(f"deepsearchqa-kb:{data_seed}:{n_entities}")
    names = _Names(rng)
    counts = _counts(n_entities)
    kb = KnowledgeBase(seed=data_seed, regions=[])
    region_kinds = rng.sample(_REGION_KINDS, 4)
    kb.regions = [names.unique(lambda kind=kind: f"the {names.word((2, 2))} {kind}") for kind in region_kinds]

    for _ in range(counts["countries"]):
        name = names.unique(lambda: names.word((2, 3)) + rng.choice(["ia", "and", "ar", "esh", ""]))
        kb.countries[name] = {
            "region": rng.choice(kb.regions),
            "independence_year": rng.randint(1700, 1990),
            "cities": [],
        }
    country_names = list(kb.countries)
    for index in range(counts["cities"]):
        name = names.unique(lambda: names.word((2, 2)) + rng.choice(_CITY_ENDINGS))
        # Every country gets a city first, then the rest are spread at random.
        country = country_names[index] if index < len(country_names) else rng.choice(country_names)
        kb.cities[name] = {
            "country": country,
            "founded_year": rng.randint(800, 1900),
            "population": rng.randint(20, 3000) * 1000,
            "companies": [],
            "people": [],
        }
        kb.countries[country]["cities"].append(name)
    for country in kb.countries.values():
        country["capital"] = country["cities"][0]

    for _ in range(counts["awards"]):
        name = names.unique(lambda: f"{names.word((2, 3))} {rng.choice(_AWARD_KINDS)}")
        kb.awards[name] = {
            "country": rng.choice(country_names),
            "established_year": rng.randint(1880, 1960),
            "recipients": [],
        }

    city_names = list(kb.cities)
    for _ in range(counts["people"]):
        name = names.unique(lambda: f"{names.word((2, 2))} {names.word((2, 3))}")
        birth_city = rng.choice(city_names)
        kb.people[name] = {
            "birth_year": rng.randint(1900, 1985),
            "birth_city": birth_city,
            "profession": rng.choice(list(PROFESSIONS)),
            "employer": None,
            "founded": None,
            "award": None,
            "works": [],
        }
        kb.cities[birth_city]["people"].append(name)
    people_names = list(kb.people)

    founders = rng.sample(people_names, min(counts["companies"], len(people_names)))
    for founder in founders:
        name = names.unique(lambda: f"{names.word((2, 3))} {rng.choice(_COMPANY_SUFFIXES)}")
        hq = rng.choice(city_names)
        kb.companies[name] = {
            "industry": rng.choice(INDUSTRIES),
            "hq": hq,
            "founder": founder,
            "founded_year": kb.people[founder]["birth_year"] + rng.randint(25, 45),
        }
        kb.people[founder]["founded"] = name
        kb.people[founder]["employer"] = name  # a founder works for their own company
        kb.cities[hq]["companies"].append(name)
    company_names = list(kb.companies)
    for person in people_names:
        if kb.people[person]["employer"] is None and rng.random() < 0.75:
            kb.people[person]["employer"] = rng.choice(company_names)

    given: set[tuple[str, int]] = (
        set()
    )  # (award, year): at most one recipient, so "the recipient of A in Y" is one person
    award_names = list(kb.awards)
    for person in people_names:
        if rng.random() >= 0.35:
            continue
        award = rng.choice(award_names)
        established = kb.awards[award]["established_year"]
        born = kb.people[person]["birth_year"]
        for _ in range(20):
            year = rng.randint(max(established, born + 30), max(established, born + 30) + 30)
            if (award, year) not in given and year <= 2024:
                given.add((award, year))
                kb.people[person]["award"] = [award, year]
                kb.awards[award]["recipients"].append([person, year])
                break

    creators = [p for p in people_names if kb.people[p]["profession"] in WORK_KINDS] or people_names
    for _ in range(counts["works"]):
        creator = rng.choice(creators)
        title = names.unique(lambda: f"{names.word((2, 3))} {rng.choice(_WORK_NOUNS)}")
        kind = WORK_KINDS.get(kb.people[creator]["profession"], "book")
        kb.works[title] = {
            "creator": creator,
            "kind": kind,
            "year": kb.people[creator]["birth_year"] + rng.randint(22, 60),
        }
        kb.people[creator]["works"].append(title)

    kb.pages = _pages(kb)
    return kb


def _pages(kb: KnowledgeBase) -> list[dict]:
    """One page per entity, {id, title, text}: plain sentences stating its facts and links."""
    pages = []

    def add(kind: str, title: str, sentences: list[str]) -> None:
        pages.append({"id": f"{kind}-{len(pages):05d}", "title": title, "text": " ".join(s for s in sentences if s)})

    for name, c in kb.countries.items():
        add("country", name, [
            f"{name} is a country in {c['region']}.",
            f"Its capital is {c['capital']}.",
            f"{name} became independent in {c['independence_year']}.",
            f"The cities of {name} are {_join(c['cities'])}." if len(c["cities"]) > 1 else f"Its only city is {c['capital']}.",
        ])  # fmt: skip
    for name, c in kb.cities.items():
        add("city", name, [
            f"{name} is a city in {c['country']}, founded in {c['founded_year']}.",
            f"It has a population of about {c['population']:,}.",
            f"{name} is the capital of {c['country']}." if kb.countries[c["country"]]["capital"] == name else "",
            f"Companies headquartered in {name}: {_join(c['companies'])}." if c["companies"] else "",
            f"People born in {name}: {_join(c['people'])}." if c["people"] else "",
        ])  # fmt: skip
    for name, p in kb.people.items():
        award = p["award"]
        add("person", name, [
            f"{name} is a {p['profession']} born in {p['birth_year']} in {p['birth_city']}.",
            f"{name} founded {p['founded']}." if p["founded"] else "",
            f"{name} works for {p['employer']}." if p["employer"] else "",
            f"{name} received the {award[0]} in {award[1]}." if award else "",
            f"{name} created {_join(p['works'])}." if p["works"] else "",
        ])  # fmt: skip
    for name, c in kb.companies.items():
        add("company", name, [
            f"{name} is a {c['industry']} company headquartered in {c['hq']}.",
            f"It was founded in {c['founded_year']} by {c['founder']}.",
        ])  # fmt: skip
    for name, a in kb.awards.items():
        recipients = [f"{person} ({year})" for person, year in sorted(a["recipients"], key=lambda r: r[1])]
        add("award", name, [
            f"The {name} is an award established in {a['established_year']} in {a['country']}.",
            f"Its recipients are {_join(recipients)}." if recipients else "It has not been awarded yet.",
        ])  # fmt: skip
    for name, w in kb.works.items():
        add("work", name, [f"{name} is a {w['kind']} by {w['creator']}, completed in {w['year']}."])
    return pages


# -- questions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One question the knowledge base can ask: its template, the entity (or entities) it is
    about, the text, and the gold items (empty for a set question that no entity meets)."""

    template: str
    anchor: str
    problem: str
    category: str
    answer_type: str
    gold: tuple[str, ...]


def _single(kb: KnowledgeBase) -> Iterable[Candidate]:
    for name, c in kb.companies.items():
        founder = c["founder"]
        yield Candidate(
            "founder_birth_country",
            name,
            f"In which country was the founder of {name} born?",
            "business",
            SINGLE,
            (kb.birth_country(founder),),
        )
        yield Candidate(
            "founder_birth_year",
            name,
            f"In what year was the person who founded {name} born?",
            "people",
            SINGLE,
            (str(kb.people[founder]["birth_year"]),),
        )
        yield Candidate(
            "hq_country_independence",
            name,
            f"In what year did the country where {name} has its headquarters become independent?",
            "history",
            SINGLE,
            (str(kb.countries[kb.country_of(c["hq"])]["independence_year"]),),
        )
    for name, p in kb.people.items():
        yield Candidate(
            "birth_country_capital",
            name,
            f"What is the capital of the country where {name} was born?",
            "geography",
            SINGLE,
            (kb.countries[kb.birth_country(name)]["capital"],),
        )
        if p["employer"]:
            yield Candidate(
                "employer_hq_city",
                name,
                f"In which city is the company that {name} works for headquartered?",
                "business",
                SINGLE,
                (kb.companies[p["employer"]]["hq"],),
            )
    for name, w in kb.works.items():
        creator = kb.people[w["creator"]]
        yield Candidate(
            "creator_birth_city",
            name,
            f"In which city was the creator of {name} born?",
            "arts",
            SINGLE,
            (creator["birth_city"],),
        )
        if creator["employer"]:
            yield Candidate(
                "creator_employer_industry",
                name,
                f"In which industry does the employer of the person who created {name} work?",
                "arts",
                SINGLE,
                (kb.companies[creator["employer"]]["industry"],),
            )
    for name, a in kb.awards.items():
        yield Candidate(
            "award_country_capital",
            name,
            f"What is the capital of the country where the {name} was established?",
            "history",
            SINGLE,
            (kb.countries[a["country"]]["capital"],),
        )
        for person, year in a["recipients"]:
            yield Candidate(
                "award_year_profession",
                f"{name}|{year}",
                f"What is the profession of the person who received the {name} in {year}?",
                "awards",
                SINGLE,
                (kb.people[person]["profession"],),
            )
    for name, c in kb.cities.items():
        yield Candidate(
            "city_region",
            name,
            f"In which region is the country that {name} belongs to?",
            "geography",
            SINGLE,
            (kb.countries[c["country"]]["region"],),
        )


def _sets(kb: KnowledgeBase) -> Iterable[Candidate]:
    ask = "List all of them."
    for city, c in kb.cities.items():
        for country in kb.countries:
            gold = [co for co in c["companies"] if kb.birth_country(kb.companies[co]["founder"]) == country]
            yield Candidate(
                "city_companies_founder_country",
                f"{city}|{country}",
                f"Which companies headquartered in {city} were founded by people born in {country}? {ask}",
                "business",
                SET,
                tuple(sorted(gold)),
            )
        awarded = [p for p in c["people"] if kb.people[p]["award"]]
        yield Candidate(
            "city_people_awarded",
            city,
            f"Which people born in {city} have received an award? {ask}",
            "people",
            SET,
            tuple(sorted(awarded)),
        )
    for country in kb.countries:
        for industry in INDUSTRIES:
            gold = [
                co for co, c in kb.companies.items() if c["industry"] == industry and kb.country_of(c["hq"]) == country
            ]
            yield Candidate(
                "country_industry_companies",
                f"{country}|{industry}",
                f"Which {industry} companies have their headquarters in a city of {country}? {ask}",
                "business",
                SET,
                tuple(sorted(gold)),
            )
        works = [w for w, info in kb.works.items() if kb.birth_country(info["creator"]) == country]
        yield Candidate(
            "country_works",
            country,
            f"Which works were created by people born in {country}? {ask}",
            "arts",
            SET,
            tuple(sorted(works)),
        )
        for award, a in kb.awards.items():
            gold = [p for p, _ in a["recipients"] if kb.birth_country(p) == country]
            yield Candidate(
                "award_recipients_country",
                f"{award}|{country}",
                f"Which recipients of the {award} were born in {country}? {ask}",
                "awards",
                SET,
                tuple(sorted(gold)),
            )
    employees: dict[str, list[str]] = {}
    for person, p in kb.people.items():
        if p["employer"]:
            employees.setdefault(p["employer"], []).append(person)
    for company in kb.companies:
        for profession, plural in PROFESSIONS.items():
            gold = [p for p in employees.get(company, []) if kb.people[p]["profession"] == profession]
            yield Candidate(
                "company_profession_employees",
                f"{company}|{profession}",
                f"Which {plural} work for {company}? {ask}",
                "people",
                SET,
                tuple(sorted(gold)),
            )


def candidates(kb: KnowledgeBase) -> list[Candidate]:
    """Every question the knowledge base can ask unambiguously, in a fixed order (set questions
    with more than MAX_SET_SIZE gold items are left out)."""
    return [c for c in [*_single(kb), *_sets(kb)] if len(c.gold) <= MAX_SET_SIZE]


def _interleave(pool: list[Candidate], rng: random.Random) -> list[Candidate]:
    """The pool shuffled so that templates take turns: a small draw still covers every template."""
    by_template: dict[str, list[Candidate]] = {}
    for candidate in pool:
        by_template.setdefault(candidate.template, []).append(candidate)
    groups = [by_template[t] for t in sorted(by_template)]
    for group in groups:
        rng.shuffle(group)
    rng.shuffle(groups)
    ordered = []
    for turn in range(max((len(g) for g in groups), default=0)):
        ordered.extend(group[turn] for group in groups if turn < len(group))
    return ordered


def question_key(row: dict) -> tuple[str, str]:
    """What a question asks about what: (template, anchor). Held-out questions never share one
    with a training question."""
    return row["template"], row["anchor"]


def questions(
    kb: KnowledgeBase, seed: int, n: int, *, exclude: Iterable[dict] = (), id_prefix: str = "q"
) -> list[dict]:
    """`n` questions drawn with `seed`: about SINGLE_FRACTION single-answer, EMPTY_FRACTION
    empty-gold set questions (at least one when n >= 10), the rest set questions with 1 to
    MAX_SET_SIZE gold items; none with the problem text or the (template, anchor) of a row in
    `exclude`. Rows: id, problem, problem_category, answer (comma-joined gold items, "None" when
    empty), answer_type, gold_items, template, anchor."""
    excluded_text = set()
    excluded_keys = set()
    for row in exclude:
        excluded_text.add(row["problem"])
        excluded_keys.add(question_key(row))
    pool = [c for c in candidates(kb) if c.problem not in excluded_text and (c.template, c.anchor) not in excluded_keys]
    rng = random.Random(f"deepsearchqa-questions:{seed}")
    singles = _interleave([c for c in pool if c.answer_type == SINGLE], rng)
    sets = _interleave([c for c in pool if c.answer_type == SET and c.gold], rng)
    empties = _interleave([c for c in pool if c.answer_type == SET and not c.gold], rng)
    if len(pool) < n:
        raise ValueError(f"the knowledge base can ask only {len(pool)} more questions, not {n}: raise kb_size")
    n_empty = min(len(empties), max(1, round(n * EMPTY_FRACTION)) if n >= 10 else 0)
    n_single = min(len(singles), round(n * SINGLE_FRACTION))
    n_set = min(len(sets), n - n_single - n_empty)
    chosen = singles[:n_single] + sets[:n_set] + empties[:n_empty]
    # A small knowledge base may run short of one kind: the others fill in.
    rest = singles[n_single:] + sets[n_set:] + empties[n_empty:]
    chosen += rest[: n - len(chosen)]
    rng.shuffle(chosen)
    return [
        {
            "id": f"{id_prefix}-{index:04d}",
            "problem": c.problem,
            "problem_category": CATEGORIES[c.category],
            "answer": ", ".join(c.gold) if c.gold else NONE_ANSWER,
            "answer_type": c.answer_type,
            "gold_items": list(c.gold),
            "template": c.template,
            "anchor": c.anchor,
        }
        for index, c in enumerate(chosen)
    ]
