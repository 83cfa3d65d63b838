"""A procedurally generated encyclopedia of a fictional world, and multi-hop questions about it.

Entities: countries, cities, people, organisations (publishers, companies, universities), books
and events, linked by functional relations (a book's author and publisher, an organisation's
founder and headquarters, a person's birthplace and university, a city's country, an event's
city and organiser, a country's capital). Each entity becomes one encyclopedia-style article, one
sentence per line. Distractors come from the world itself: articles mention many other entities
(a city lists people born there, a book is set in another city, a person lived elsewhere), and
some people share a full name with another person (their titles carry the occupation, and
articles that mention them say "the painter X").

Questions walk 1 to 4 relations from a named entity (bridge: "In which city was the founder of
the company that published X born?") or compare two entities (comparison: "Who was born
earlier, A or B?"); each has its answer, the ids of the articles needed (`supporting_ids`, in
reading order) and `hops` = how many articles; a comparison also has its two `options`, in the
question's order (a two-way question: the pair is a uniform random draw, so the answer is the
first option about as often as the second, 51 / 53 in the shipped eval split). Everything is
deterministic per (seed, split); the train and eval splits draw names from disjoint halves of
the name space, so no entity name (and no question) is shared between them.

    python -m deep_research --split eval --out DIR   # writes corpus.jsonl, questions.jsonl
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deep_research.corpus import Document, write_documents

SPLITS = ("train", "eval")
SYLLABLES = (
    "ka ri mo ta ven lo sa mir del ar tan is or el va ne bri sto ga lu fen dor ra mi "
    "ko zan te ul qua pe har vi no sel tor ma jin bel cas"
).split()
OCCUPATIONS = (
    "painter novelist architect chemist composer physicist sculptor historian poet "
    "engineer photographer economist botanist astronomer playwright"
).split()
ADJECTIVES = (
    "Silent Glass Hollow Crimson Northern Last Distant Iron Quiet Golden Broken Salt Winter "
    "Hidden Burning Paper Velvet Bitter Pale Wandering Empty Second Lost Amber"
).split()
NOUNS = (
    "Orchard Harbour Lantern Meridian Garden River Archive Tower Mirror Season Bridge Compass "
    "Island Letter Forest Voyage Machine Cathedral Shadow Theorem Frontier Empire Chorus"
).split()
GENRES = "novel,memoir,poetry collection,history,short-story collection,essay collection"
GENRES = GENRES.split(",")
EVENT_KINDS = ("Film Festival", "Book Fair", "Science Conference", "Music Festival", "Marathon")
ORG_KINDS = ("publisher", "company", "university")
COMPANY_SUFFIXES = ("Holdings", "Industries", "Works", "Group", "Systems", "Foundry")
PUBLISHER_SUFFIXES = ("Press", "Books", "Publishing", "House")

# Entities per kind at scale 1.0 (about 2,500 articles).
BASE_COUNTS = {
    "country": 12,
    "city": 120,
    "person": 1000,
    "publisher": 100,
    "company": 120,
    "university": 80,
    "book": 900,
    "event": 150,
}
HOMONYM_FRACTION = 0.08


@dataclass(eq=False)  # identity: entities link to each other
class Entity:
    kind: str  # country, city, person, org, book, event
    name: str
    id: str = ""
    title: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)  # plain facts: years, occupation, ...
    links: dict[str, Entity] = field(default_factory=dict)  # functional relations


@dataclass(frozen=True)
class Relation:
    """A functional link used as one hop: `phrase` turns a noun phrase for the source into one
    for the target (e.g. "the founder of {}")."""

    source: str
    link: str
    phrase: str


RELATIONS = (
    Relation("book", "author", "the author of {}"),
    Relation("book", "publisher", "the company that published {}"),
    Relation("org", "founder", "the founder of {}"),
    Relation("org", "headquarters", "the city where {} is headquartered"),
    Relation("person", "birthplace", "the birthplace of {}"),
    Relation("person", "university", "the university attended by {}"),
    Relation("city", "country", "the country in which {} lies"),
    Relation("event", "city", "the city that hosts {}"),
    Relation("event", "organiser", "the organiser of {}"),
    Relation("country", "capital", "the capital of {}"),
)

# Final questions per kind: (template over the noun phrase, how to read the answer).
ATTRIBUTE_QUESTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "person": (
        ("In which year was {} born?", "birth_year"),
        ("In which city was {} born?", "birthplace"),
        ("What was the occupation of {}?", "occupation"),
    ),
    "city": (
        ("In which country is {}?", "country"),
        ("In which year was {} founded?", "founded"),
    ),
    "org": (
        ("In which year was {} founded?", "founded"),
        ("Who founded {}?", "founder"),
        ("In which city is {} headquartered?", "headquarters"),
    ),
    "book": (
        ("In which year was {} published?", "year"),
        ("Who wrote {}?", "author"),
    ),
    "event": (("In which year was {} first held?", "first_held"),),
    "country": (
        ("What is the capital of {}?", "capital"),
        ("What is the official language of {}?", "language"),
    ),
}
COMPARISONS = (
    ("person", "birth_year", "Who was born earlier, {} or {}?"),
    ("org", "founded", "Which was founded earlier, {} or {}?"),
    ("book", "year", "Which was published earlier, {} or {}?"),
    ("city", "population", "Which city has the larger population, {} or {}?"),
)
HOP_WEIGHTS = {1: 0.15, 2: 0.35, 3: 0.3, 4: 0.2}
COMPARISON_FRACTION = 0.2


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class NameMaker:
    """Unique names in one split's half of the name space (a hash of the name picks the half)."""

    def __init__(self, rng: random.Random, split: str) -> None:
        self.rng = rng
        self.parity = SPLITS.index(split)
        self.used: set[str] = set()

    def _in_split(self, name: str) -> bool:
        return hashlib.sha256(name.encode()).digest()[0] % 2 == self.parity

    def word(self, syllables: tuple[int, int] = (2, 3)) -> str:
        n = self.rng.randint(*syllables)
        return "".join(self.rng.choice(SYLLABLES) for _ in range(n)).capitalize()

    def unique(self, make: Any) -> str:
        for _ in range(10_000):
            name = make()
            if name not in self.used and self._in_split(name):
                self.used.add(name)
                return name
        raise RuntimeError("the name space is exhausted; lower the world scale")


def _pick_title(rng: random.Random, names: NameMaker) -> str:
    def make() -> str:
        pattern = rng.randrange(4)
        if pattern == 0:
            return f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
        if pattern == 1:
            return f"{rng.choice(NOUNS)} of {names.word()}"
        if pattern == 2:
            return f"The {rng.choice(NOUNS)} of the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
        return f"{rng.choice(ADJECTIVES)} {names.word()}"

    return names.unique(make)


@dataclass
class World:
    """All entities of one split; `articles()` renders them, `questions()` asks about them."""

    seed: int
    split: str
    entities: list[Entity]

    def articles(self) -> list[Document]:
        incoming: dict[int, dict[str, list[str]]] = {}
        for other in self.entities:
            for name, target in other.links.items():
                by_link = incoming.setdefault(id(target), {})
                by_link.setdefault(f"{other.kind}.{name}", []).append(mention(other))
        return [
            Document(e.id, e.title, render_article(e, incoming.get(id(e), {})))
            for e in self.entities
        ]


def generate_world(seed: int = 0, split: str = "train", scale: float = 1.0) -> World:
    """Entities and their links; deterministic per (seed, split, scale)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    rng = random.Random(f"deep-research-world-{seed}-{split}-{scale}")
    names = NameMaker(rng, split)
    count = {kind: max(2, round(n * scale)) for kind, n in BASE_COUNTS.items()}

    countries = [
        Entity("country", names.unique(lambda: names.word((2, 3)) + rng.choice(["ia", "a", "or"])))
        for _ in range(count["country"])
    ]
    for country in countries:
        country.attrs["language"] = names.unique(lambda: names.word((2, 2)) + "ic")
    cities = [Entity("city", names.unique(names.word)) for _ in range(count["city"])]
    for i, city in enumerate(cities):
        city.links["country"] = countries[i % len(countries)]
        city.attrs["founded"] = rng.randint(800, 1850)
        city.attrs["population"] = rng.randint(5, 3000) * 1000 + rng.randint(0, 999)
    for country in countries:
        country.links["capital"] = next(c for c in cities if c.links["country"] is country)

    people: list[Entity] = []
    full_names: set[str] = set()
    while len(people) < count["person"]:
        if people and rng.random() < HOMONYM_FRACTION:  # a namesake with another occupation
            twin = rng.choice(people)
            name = twin.name
            occupation = rng.choice([o for o in OCCUPATIONS if o != twin.attrs["occupation"]])
            if any(p.name == name and p.attrs["occupation"] == occupation for p in people):
                continue
        else:
            name = names.unique(lambda: f"{names.word((2, 2))} {names.word((2, 3))}")
            occupation = rng.choice(OCCUPATIONS)
        full_names.add(name)
        person = Entity("person", name, attrs={"occupation": occupation})
        person.attrs["birth_year"] = rng.randint(1800, 1960)
        person.links["birthplace"] = rng.choice(cities)
        person.attrs["lived_in"] = rng.choice(cities).name
        people.append(person)

    orgs: list[Entity] = []
    for kind in ORG_KINDS:
        for _ in range(count[kind]):
            if kind == "university":
                name = names.unique(lambda: f"{names.word()} University")
            else:
                suffixes = PUBLISHER_SUFFIXES if kind == "publisher" else COMPANY_SUFFIXES
                name = names.unique(lambda s=suffixes: f"{names.word()} {rng.choice(s)}")
            org = Entity("org", name, attrs={"org_kind": kind})
            founder = rng.choice(people)
            org.links["founder"] = founder
            org.links["headquarters"] = rng.choice(cities)
            org.attrs["founded"] = founder.attrs["birth_year"] + rng.randint(22, 60)
            orgs.append(org)
    universities = [o for o in orgs if o.attrs["org_kind"] == "university"]
    publishers = [o for o in orgs if o.attrs["org_kind"] == "publisher"]
    for person in people:
        if rng.random() < 0.7:
            person.links["university"] = rng.choice(universities)

    books = []
    for _ in range(count["book"]):
        author = rng.choice(people)
        book = Entity("book", _pick_title(rng, names), attrs={"genre": rng.choice(GENRES)})
        book.links["author"] = author
        book.links["publisher"] = rng.choice(publishers)
        book.attrs["year"] = author.attrs["birth_year"] + rng.randint(20, 70)
        book.attrs["setting"] = rng.choice(cities).name
        books.append(book)

    events = []
    for _ in range(count["event"]):
        event = Entity(
            "event", names.unique(lambda: f"{rng.choice(cities).name} {rng.choice(EVENT_KINDS)}")
        )
        event.links["city"] = next(c for c in cities if event.name.startswith(c.name + " "))
        event.links["organiser"] = rng.choice(orgs)
        event.attrs["first_held"] = rng.randint(1900, 2015)
        events.append(event)

    entities = countries + cities + people + orgs + books + events
    _assign_titles(entities)
    return World(seed, split, entities)


def _assign_titles(entities: list[Entity]) -> None:
    counts: dict[str, int] = {}
    for e in entities:
        counts[e.name] = counts.get(e.name, 0) + 1
    for e in entities:
        shared = counts[e.name] > 1
        e.title = f"{e.name} ({e.attrs['occupation']})" if shared else e.name
        e.id = slug(e.title)


def mention(entity: Entity) -> str:
    """How other articles (and questions) name an entity: people with namesakes get their
    occupation ("the painter X")."""
    if entity.kind == "person" and entity.title != entity.name:
        return f"the {entity.attrs['occupation']} {entity.name}"
    return entity.name


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def render_article(e: Entity, incoming: dict[str, list[str]]) -> str:
    """The article text, one sentence per line; `incoming` names who links here, by link."""
    a, link = e.attrs, e.links
    if e.kind == "country":
        lines = [
            f"{e.name} is a country. Its capital is {link['capital'].name}.",
            f"The official language of {e.name} is {a['language']}.",
        ]
    elif e.kind == "city":
        country = link["country"].name
        lines = [
            f"{e.name} is a city in {country}, founded in {a['founded']}.",
            f"It has a population of {a['population']:,}.",
        ]
    elif e.kind == "person":
        last = e.name.split()[-1]
        lines = [
            f"{e.name} (born {a['birth_year']}) is {_a(a['occupation'])}.",
            f"{last} was born in {link['birthplace'].name}, "
            f"{link['birthplace'].links['country'].name}, in {a['birth_year']}.",
        ]
        if "university" in link:
            lines.append(f"{last} studied at {link['university'].name}.")
        lines.append(f"{last} later lived for many years in {a['lived_in']}.")
    elif e.kind == "org":
        founder = link["founder"]
        lines = [
            f"{e.name} is {_a(a['org_kind'])} founded in {a['founded']} by {mention(founder)}.",
            f"{e.name} is headquartered in {link['headquarters'].name}.",
        ]
    elif e.kind == "book":
        lines = [
            f"{e.name} is {_a(a['genre'])} by {mention(link['author'])}, published in {a['year']}.",
            f"It was published by {link['publisher'].name}.",
            f"The book is set in {a['setting']}.",
        ]
    else:  # event
        lines = [
            f"The {e.name} is held every year in {link['city'].name}.",
            f"It was first held in {a['first_held']} and is organised by {link['organiser'].name}.",
        ]
    return "\n".join(lines + _backlinks(e, incoming))


def _backlinks(e: Entity, incoming: dict[str, list[str]]) -> list[str]:
    """Sentences listing entities that link here (the mentions that make search ambiguous)."""
    templates = {
        "person.birthplace": "Notable people born in {} include {}.",
        "org.headquarters": "Organisations headquartered in {} include {}.",
        "event.city": "{} hosts the {}.",
        "book.author": "{} wrote {}.",
        "org.founder": "{} founded {}.",
        "person.university": "Alumni of {} include {}.",
        "book.publisher": "Books published by {} include {}.",
        "event.organiser": "{} organises the {}.",
    }
    subject = e.name.split()[-1] if e.kind == "person" else e.name
    return [
        templates[key].format(subject, _listing(names[:6]))
        for key, names in incoming.items()
        if key in templates
    ]


def _answer(e: Entity, attribute: str) -> str:
    if attribute in e.links:
        return e.links[attribute].name
    return str(e.attrs[attribute])


def _bridge(rng: random.Random, world: World, hops: int, named: list[Entity]) -> dict | None:
    chain = [rng.choice(named)]
    phrase = mention(chain[0])
    for _ in range(hops - 1):
        options = [r for r in RELATIONS if r.source == chain[-1].kind and r.link in chain[-1].links]
        options = [r for r in options if chain[-1].links[r.link] not in chain]
        if not options:
            return None
        relation = rng.choice(options)
        chain.append(chain[-1].links[relation.link])
        phrase = relation.phrase.format(phrase)
    last = chain[-1]
    choices = [
        (template, attribute)
        for template, attribute in ATTRIBUTE_QUESTIONS[last.kind]
        if attribute in last.attrs
        or (attribute in last.links and last.links[attribute] not in chain)
    ]
    template, attribute = rng.choice(choices)
    answer = _answer(last, attribute)
    if answer.lower() in phrase.lower():
        return None
    question = template.format(phrase)
    return _question(question[0].upper() + question[1:], answer, chain, "bridge")


def _comparison(rng: random.Random, world: World, named: list[Entity]) -> dict | None:
    kind, attribute, template = rng.choice(COMPARISONS)
    pool = [e for e in named if e.kind == kind]
    first, second = rng.sample(pool, 2)
    if first.attrs[attribute] == second.attrs[attribute] or first.name == second.name:
        return None
    earlier = attribute != "population"
    ordered = sorted([first, second], key=lambda e: e.attrs[attribute], reverse=not earlier)
    question = template.format(mention(first), mention(second))
    item = _question(question, ordered[0].name, [first, second], "comparison")
    item["options"] = [first.name, second.name]  # in the question's order
    return item


def _question(question: str, answer: str, chain: list[Entity], kind: str) -> dict[str, Any]:
    return {
        "question": question,
        "answer": answer,
        "supporting_ids": [e.id for e in chain],
        "supporting_titles": [e.title for e in chain],
        "hops": len(chain),
        "type": kind,
    }


def generate_questions(world: World, n: int) -> list[dict[str, Any]]:
    """n distinct questions about a world; deterministic per (world, n)."""
    rng = random.Random(f"deep-research-questions-{world.seed}-{world.split}-{n}")
    named = [e for e in world.entities if e.kind != "country"]  # country names are too few
    hops, weights = zip(*HOP_WEIGHTS.items(), strict=True)
    questions: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(n * 50):
        if len(questions) == n:
            break
        if rng.random() < COMPARISON_FRACTION:
            item = _comparison(rng, world, named)
        else:
            item = _bridge(rng, world, rng.choices(hops, weights)[0], named)
        if item is not None and item["question"] not in seen:
            seen.add(item["question"])
            item["id"] = f"{world.split}-{world.seed}-{len(questions)}"
            questions.append(item)
    if len(questions) < n:
        raise ValueError(f"could only generate {len(questions)} of {n} questions; raise scale")
    return questions


def write_world(out: Path, seed: int, split: str, scale: float, num_questions: int) -> None:
    """corpus.jsonl (articles) and questions.jsonl of one split, as the environment reads them."""
    world = generate_world(seed, split, scale)
    out.mkdir(parents=True, exist_ok=True)
    write_documents(world.articles(), out / "corpus.jsonl")
    with open(out / "questions.jsonl", "w", encoding="utf-8") as f:
        for item in generate_questions(world, num_questions):
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
