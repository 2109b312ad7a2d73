"""Generate the example order data set for the ``orders`` workflow.

Writes two files next to this script:

* ``orders.json``: a JSON list of 300 orders, each valid for ``examples.orders.Order``;
* ``orders.expected.json``: ``{order_id: {"status": ..., "reason": ...}}``, the outcome
  each order must reach under the deterministic rules of ``examples/orders.py``.

Usage::

    uv run python examples/data/generate_orders.py            # rewrite both files
    uv run python examples/data/generate_orders.py --check    # fail if they are stale

The output depends only on the seed (``random.Random(20261129)``) and this file: running
it again reproduces the same bytes. Stdlib only, so it runs without the project installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import string
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

SEED = 20261129
ORDER_COUNT = 300
HERE = Path(__file__).resolve().parent
ORDERS_PATH = HERE / "orders.json"
EXPECTED_PATH = HERE / "orders.expected.json"

# Mirrors examples/orders.py (kept in sync by hand; this script must not import the app).
SUPPORTED_COUNTRIES = frozenset(
    {"US", "CA", "GB", "DE", "FR", "NL", "SE", "JP", "AU", "NZ", "IE", "ES"}
)
DECLINED_TOKENS = ("tok_declined", "tok_insufficient_funds", "tok_stolen")
PROCESSING_ERROR_TOKEN = "tok_processing_error"
DISCONTINUED_PREFIX = "DISCONTINUED-"
INVENTORY_MAX_ATTEMPTS = 5  # RetryPolicy(max_attempts=5) on reserve_inventory

# How many orders of each kind (exact counts, then shuffled): 8% / 8% / 5% / 3% / rest.
Kind = Literal["bad_address", "declined", "processing_error", "discontinued", "valid"]
KIND_COUNTS: dict[Kind, int] = {
    "bad_address": 24,
    "declined": 24,
    "processing_error": 15,
    "discontinued": 9,
}

Status = Literal["completed", "failed"]
Reason = Literal["succeeded", "failure_non_retryable", "failure_attempts_exhausted"]


@dataclass(frozen=True)
class Person:
    """A made-up customer: display name and the ASCII handle used for the e-mail."""

    name: str
    handle: str


@dataclass(frozen=True)
class City:
    """A city and a function producing a plausible postal code there."""

    name: str
    postal: Callable[[random.Random], str]


@dataclass(frozen=True)
class Country:
    """Everything needed to make an address in one country."""

    code: str
    people: Sequence[Person]
    cities: Sequence[City]
    street: Callable[[random.Random], str]
    line2: Sequence[str]


# --- postal code helpers -------------------------------------------------------------------


def num(prefix: str, total: int) -> Callable[[random.Random], str]:
    """Numeric postal code of ``total`` digits starting with ``prefix``."""
    return lambda r: prefix + "".join(r.choice(string.digits) for _ in range(total - len(prefix)))


def us_zip(prefix: str) -> Callable[[random.Random], str]:
    """US ZIP code, sometimes in ZIP+4 form."""

    def make(r: random.Random) -> str:
        base = num(prefix, 5)(r)
        return f"{base}-{r.randint(1000, 9999)}" if r.random() < 0.2 else base

    return make


def ca_postal(first: str) -> Callable[[random.Random], str]:
    """Canadian postal code ``A1A 1A1`` (no D, F, I, O, Q, U)."""
    letters = "ABCEGHJKLMNPRSTVWXYZ"

    def make(r: random.Random) -> str:
        return (
            f"{first}{r.randint(0, 9)}{r.choice(letters)} "
            f"{r.randint(0, 9)}{r.choice(letters)}{r.randint(0, 9)}"
        )

    return make


def gb_postcode(area: str) -> Callable[[random.Random], str]:
    """UK postcode: outward code from ``area`` plus an inward code like ``4AB``."""
    letters = "ABDEFGHJLNPQRSTUWXYZ"

    def make(r: random.Random) -> str:
        return f"{area}{r.randint(1, 20)} {r.randint(0, 9)}{r.choice(letters)}{r.choice(letters)}"

    return make


def nl_postcode(prefix: str) -> Callable[[random.Random], str]:
    """Dutch postcode ``1234 AB``."""
    letters = "ABCDEGHJKLMNPRTVWXZ"
    return lambda r: f"{num(prefix, 4)(r)} {r.choice(letters)}{r.choice(letters)}"


def se_postcode(prefix: str) -> Callable[[random.Random], str]:
    """Swedish postcode ``123 45``."""

    def make(r: random.Random) -> str:
        code = num(prefix, 5)(r)
        return f"{code[:3]} {code[3:]}"

    return make


def jp_postcode(prefix: str) -> Callable[[random.Random], str]:
    """Japanese postcode ``123-4567``."""

    def make(r: random.Random) -> str:
        code = num(prefix, 7)(r)
        return f"{code[:3]}-{code[3:]}"

    return make


def eircode(routing: str) -> Callable[[random.Random], str]:
    """Irish Eircode: routing key plus a four-character unique identifier."""
    chars = "ACDEFHKNPRTVWXY0123456789"
    return lambda r: f"{routing} {''.join(r.choice(chars) for _ in range(4))}"


# --- streets ---------------------------------------------------------------------------------


def en_street(names: Sequence[str], kinds: Sequence[str]) -> Callable[[random.Random], str]:
    """``123 Name Kind`` (US, CA, GB, AU, NZ, IE)."""
    return lambda r: f"{r.randint(1, 2999)} {r.choice(names)} {r.choice(kinds)}"


def number_after(names: Sequence[str], hi: int = 180) -> Callable[[random.Random], str]:
    """``Name 12`` (DE, NL, SE), sometimes with a letter suffix."""

    def make(r: random.Random) -> str:
        suffix = r.choice(["", "", "", "a", "b", "A"])
        return f"{r.choice(names)} {r.randint(1, hi)}{suffix}"

    return make


def fr_street(r: random.Random) -> str:
    """``12 rue des Lilas``, ``3 bis avenue ...``."""
    kind = r.choice(["rue", "rue", "avenue", "boulevard", "impasse", "place", "allée"])
    name = r.choice(
        [
            "des Lilas",
            "Victor Hugo",
            "de la République",
            "Jean Jaurès",
            "du Général Leclerc",
            "des Écoles",
            "Émile Zola",
            "de la Paix",
            "Saint-Honoré",
            "des Tanneurs",
            "du Moulin Vert",
        ]
    )
    bis = r.choice(["", "", "", "", " bis", " ter"])
    return f"{r.randint(1, 220)}{bis} {kind} {name}"


def es_street(r: random.Random) -> str:
    """Make a Spanish street line: ``Calle de Alcalá, 45`` or ``Carrer de Mallorca, 201``."""
    kind = r.choice(["Calle", "Calle", "Avenida", "Paseo", "Plaza", "Carrer"])
    name = r.choice(
        [
            "de Alcalá",
            "Mayor",
            "de la Constitución",
            "del Olivo",
            "de Mallorca",
            "de Santa Ana",
            "de los Reyes Católicos",
            "del Río",
            "de Colón",
            "de la Marina",
        ]
    )
    return f"{kind} {name}, {r.randint(1, 250)}"


def jp_street(r: random.Random) -> str:
    """Chōme-banchi-gō block address, in kanji or romanised."""
    block = f"{r.randint(1, 6)}-{r.randint(1, 30)}-{r.randint(1, 20)}"
    if r.random() < 0.5:
        ward = r.choice(["渋谷区神南", "新宿区西新宿", "中央区銀座", "北区梅田", "中京区烏丸通"])
        return f"{ward}{block}"
    ward = r.choice(["Jingumae", "Nishi-Shinjuku", "Ginza", "Umeda", "Sakae", "Tenjin"])
    return f"{block} {ward}"


# --- people ----------------------------------------------------------------------------------


def people(*pairs: tuple[str, str]) -> tuple[Person, ...]:
    """Build ``Person`` values from ``(name, handle)`` pairs."""
    return tuple(Person(n, h) for n, h in pairs)


COUNTRIES: tuple[Country, ...] = (
    Country(
        "US",
        people(
            ("Maria Gonzalez", "maria.gonzalez"),
            ("James Whitaker", "jwhitaker"),
            ("Aaliyah Brooks", "aaliyah.brooks"),
            ("Chen Wei", "chen.wei"),
            ("Nguyễn Thị Lan", "lan.nguyen"),
            ("Dwayne O'Connell", "dwayne.oconnell"),
            ("Priya Raman", "priya.raman"),
            ("Ethan Kowalski", "ekowalski"),
            ("Renée Dubois-Carter", "renee.dc"),
        ),
        (
            City("Portland", us_zip("972")),
            City("Austin", us_zip("787")),
            City("Springfield", us_zip("627")),
            City("Madison", us_zip("537")),
            City("Asheville", us_zip("288")),
            City("Boise", us_zip("837")),
            City("Santa Fe", us_zip("875")),
            City("Burlington", us_zip("054")),
        ),
        en_street(
            ["Maple", "Oak", "Cedar Ridge", "Juniper", "Lakeview", "Sycamore", "Willow Creek"],
            ["St", "Ave", "Blvd", "Dr", "Ln", "Ct", "Way"],
        ),
        ["Apt 4B", "Suite 210", "Unit 12", "Apt 4 🏠", "PO Box 118", "Floor 3"],
    ),
    Country(
        "CA",
        people(
            ("Émilie Tremblay", "emilie.tremblay"),
            ("Liam MacDonald", "liam.macdonald"),
            ("Harpreet Sandhu", "hsandhu"),
            ("Chloé Gagnon", "chloe.gagnon"),
            ("Noah Lavoie", "noah.lavoie"),
            ("Siu Ming Cheung", "siuming.cheung"),
        ),
        (
            City("Toronto", ca_postal("M")),
            City("Montréal", ca_postal("H")),
            City("Québec", ca_postal("G")),
            City("Vancouver", ca_postal("V")),
            City("Halifax", ca_postal("B")),
            City("Winnipeg", ca_postal("R")),
        ),
        en_street(
            ["Birch", "Rue Saint-Denis", "Queen", "Harbour", "Spruce", "Maple Leaf"],
            ["St", "Ave", "Rd", "Cres"],
        ),
        ["Apt 1203", "Unit 7", "app. 5", "Suite 400", "Apt 4 🏠"],
    ),
    Country(
        "GB",
        people(
            ("Oliver Pennington", "oliver.pennington"),
            ("Amelia Hargreaves", "amelia.h"),
            ("Rhys Llewellyn", "rhys.llewellyn"),
            ("Fatima Begum", "fatima.begum"),
            ("Isla MacLeod", "isla.macleod"),
            ("Declan O'Sullivan", "declan.osullivan"),
        ),
        (
            City("Manchester", gb_postcode("M")),
            City("Leeds", gb_postcode("LS")),
            City("Edinburgh", gb_postcode("EH")),
            City("Bristol", gb_postcode("BS")),
            City("Cardiff", gb_postcode("CF")),
            City("Norwich", gb_postcode("NR")),
        ),
        en_street(
            ["Kingsley", "Abbey", "Mill", "Thornbury", "Hawthorn", "Victoria", "Chapel"],
            ["Road", "Street", "Lane", "Close", "Gardens", "Terrace"],
        ),
        ["Flat 3", "Flat 2A", "The Old Rectory", "c/o Reception", "Unit 9"],
    ),
    Country(
        "DE",
        people(
            ("Zoë Müller", "zoe.mueller"),
            ("Jürgen Weiß", "juergen.weiss"),
            ("Lena Schröder", "lena.schroeder"),
            ("Maximilian Bauer", "max.bauer"),
            ("Ayşe Yılmaz", "ayse.yilmaz"),
            ("Friederike Groß", "f.gross"),
        ),
        (
            City("Berlin", num("10", 5)),
            City("München", num("80", 5)),
            City("Köln", num("50", 5)),
            City("Hamburg", num("20", 5)),
            City("Düsseldorf", num("40", 5)),
            City("Leipzig", num("04", 5)),
        ),
        number_after(
            [
                "Lindenstraße",
                "Am Mühlbach",
                "Goethestraße",
                "Schillerplatz",
                "Hauptstraße",
                "Kastanienallee",
                "Bahnhofstraße",
                "Große Ulrichstraße",
            ]
        ),
        ["2. OG", "Hinterhaus", "c/o Schmidt", "3. OG links", "Apt 4 🏠"],
    ),
    Country(
        "FR",
        people(
            ("François Lefèvre", "francois.lefevre"),
            ("Camille Roux", "camille.roux"),
            ("Hélène Château", "helene.chateau"),
            ("Mathéo Girard", "matheo.girard"),
            ("Inès Benali", "ines.benali"),
            ("Gaëlle Le Goff", "gaelle.legoff"),
        ),
        (
            City("Paris", num("750", 5)),
            City("Lyon", num("6900", 5)),
            City("Marseille", num("130", 5)),
            City("Nantes", num("440", 5)),
            City("Strasbourg", num("670", 5)),
            City("Besançon", num("250", 5)),
        ),
        fr_street,
        ["Bâtiment B", "Escalier 2, 4e étage", "Appartement 12", "Résidence Les Tilleuls"],
    ),
    Country(
        "NL",
        people(
            ("Sanne de Vries", "sanne.devries"),
            ("Daan van den Berg", "daan.vdberg"),
            ("Lotte Jansen", "lotte.jansen"),
            ("Bram Visser", "bram.visser"),
            ("Noor El Amrani", "noor.elamrani"),
        ),
        (
            City("Amsterdam", nl_postcode("10")),
            City("Utrecht", nl_postcode("35")),
            City("Rotterdam", nl_postcode("30")),
            City("Den Haag", nl_postcode("25")),
            City("Eindhoven", nl_postcode("56")),
        ),
        number_after(
            ["Keizersgracht", "Prinsenstraat", "Oudegracht", "Lindengracht", "Dorpsweg"], hi=400
        ),
        ["3 hoog", "bis", "Huis A"],
    ),
    Country(
        "SE",
        people(
            ("Søren Ødegård", "soren.odegard"),
            ("Åsa Lindqvist", "asa.lindqvist"),
            ("Björn Ångström", "bjorn.angstrom"),
            ("Elin Sjöberg", "elin.sjoberg"),
            ("Oskar Nyström", "oskar.nystrom"),
        ),
        (
            City("Stockholm", se_postcode("11")),
            City("Göteborg", se_postcode("41")),
            City("Malmö", se_postcode("21")),
            City("Uppsala", se_postcode("75")),
            City("Umeå", se_postcode("90")),
        ),
        number_after(["Storgatan", "Drottninggatan", "Kungsgatan", "Sveavägen", "Östra Hamngatan"]),
        ["lgh 1102", "c/o Berg", "2 tr"],
    ),
    Country(
        "JP",
        people(
            ("山田太郎", "taro.yamada"),
            ("佐藤花子", "hanako.sato"),
            ("Kenji Watanabe", "kenji.watanabe"),
            ("鈴木一郎", "ichiro.suzuki"),
            ("Yuki Tanaka", "yuki.tanaka"),
            ("高橋美咲", "misaki.takahashi"),
        ),
        (
            City("東京都", jp_postcode("15")),
            City("Tokyo", jp_postcode("16")),
            City("大阪市", jp_postcode("53")),
            City("Nagoya", jp_postcode("46")),
            City("京都市", jp_postcode("60")),
            City("Fukuoka", jp_postcode("81")),
        ),
        jp_street,
        ["グリーンハイツ301号室", "Sakura Mansion 502", "Room 1201"],
    ),
    Country(
        "AU",
        people(
            ("Jack Thompson", "jack.thompson"),
            ("Charlotte Nguyen", "charlotte.nguyen"),
            ("Mia Papadopoulos", "mia.papadopoulos"),
            ("Lachlan Byrne", "lachlan.byrne"),
            ("Aroha Williams", "aroha.williams"),
        ),
        (
            City("Sydney", num("20", 4)),
            City("Melbourne", num("30", 4)),
            City("Brisbane", num("40", 4)),
            City("Perth", num("60", 4)),
            City("Hobart", num("70", 4)),
        ),
        en_street(
            ["Banksia", "Wattle", "Jacaranda", "Coral Sea", "Eucalypt"],
            ["St", "Cres", "Pde", "Rd", "Tce"],
        ),
        ["Unit 5", "Level 2", "Shop 14", "Unit 2 🏡"],
    ),
    Country(
        "NZ",
        people(
            ("Hēmi Parata", "hemi.parata"),
            ("Olivia Tūhoe-Smith", "olivia.ts"),
            ("Sione Fifita", "sione.fifita"),
            ("Grace McKenzie", "grace.mckenzie"),
        ),
        (
            City("Auckland", num("10", 4)),
            City("Wellington", num("60", 4)),
            City("Christchurch", num("80", 4)),
            City("Dunedin", num("90", 4)),
            City("Tauranga", num("31", 4)),
        ),
        en_street(
            ["Kōwhai", "Pōhutukawa", "Rimu", "Harbour View", "Tōtara"],
            ["Street", "Road", "Terrace", "Place"],
        ),
        ["Flat 2", "Unit 3B"],
    ),
    Country(
        "IE",
        people(
            ("Siobhán Ní Bhriain", "siobhan.nibhriain"),
            ("Cian Ó Murchú", "cian.omurchu"),
            ("Aoife Kavanagh", "aoife.kavanagh"),
            ("Pádraig Doyle", "padraig.doyle"),
        ),
        (
            City("Dublin", eircode("D02")),
            City("Dublin", eircode("D08")),
            City("Cork", eircode("T12")),
            City("Galway", eircode("H91")),
            City("Limerick", eircode("V94")),
        ),
        en_street(
            ["Sráid Mhór", "Parnell", "Glenview", "Ashgrove", "Quay"],
            ["Street", "Road", "Park", "Avenue"],
        ),
        ["Apartment 6", "The Courtyard"],
    ),
    Country(
        "ES",
        people(
            ("José Martínez Ruiz", "jose.martinez"),
            ("Lucía Fernández", "lucia.fernandez"),
            ("Jordi Puig i Soler", "jordi.puig"),
            ("Nerea Etxeberria", "nerea.etxeberria"),
            ("Begoña Núñez", "begona.nunez"),
        ),
        (
            City("Madrid", num("280", 5)),
            City("Barcelona", num("080", 5)),
            City("Sevilla", num("410", 5)),
            City("València", num("460", 5)),
            City("Bilbao", num("480", 5)),
            City("A Coruña", num("150", 5)),
        ),
        es_street,
        ["3º 2ª", "Bajo B", "Escalera izquierda, 1º"],
    ),
)

# Addresses in countries Treadle's example does not ship to (validation fails).
UNSUPPORTED: tuple[tuple[str, str, str, str], ...] = (
    # country, city, postal code, street
    ("RU", "Moscow", "101000", "ul. Tverskaya 12"),
    ("RU", "Saint Petersburg", "190000", "Nevsky Prospekt 28"),
    ("KP", "Pyongyang", "", "Sungri Street 7"),
    ("XX", "Testville", "00000", "1 Placeholder Road"),
    ("BR", "São Paulo", "01310-100", "Avenida Paulista, 1578"),
    ("IN", "Bengaluru", "560001", "14 MG Road"),
)

# --- catalogue -------------------------------------------------------------------------------

PRODUCTS: tuple[tuple[str, tuple[str, ...], int, int], ...] = (
    # SKU stem, variants, min price (cents), max price (cents)
    ("TEE-ORG", ("BLK-S", "BLK-M", "WHT-L", "NVY-XL", "OLV-M"), 1800, 3200),
    ("HOODIE-ZIP", ("GRY-M", "BLK-L", "FOR-S"), 4900, 7900),
    ("SOCK-WOOL", ("3PK-M", "3PK-L", "1PR-S"), 900, 2400),
    ("MUG-STN", ("350ML", "450ML-SAGE"), 1200, 2600),
    ("KB-MECH", ("ISO-DE", "ANSI-US", "JIS"), 8900, 18900),
    ("CABLE-USBC", ("1M", "2M", "2M-BRAIDED"), 799, 2499),
    ("LAMP-DESK", ("OAK", "WALNUT"), 3900, 8900),
    ("BOOK", ("9780140449136", "9780261102354", "9784101010014"), 899, 3499),
    ("TEA-LOOSE", ("SENCHA-100G", "ASSAM-250G", "ROOIBOS-100G"), 650, 1890),
    ("BACKPACK-25L", ("CHAR", "RUST"), 7900, 12900),
    ("NOTEBOOK-A5", ("DOT", "GRID", "PLAIN"), 750, 1600),
    ("HEADPHONE-BT", ("BLK", "SAND"), 5900, 24900),
    ("PLANT-POT", ("S-TERRACOTTA", "M-GLAZED", "L-CONCRETE"), 1100, 4500),
    ("GIFTWRAP", ("STD",), 0, 0),
    ("SAMPLE-COFFEE", ("ETH-30G", "COL-30G"), 0, 0),
    ("CHARGER-65W", ("EU", "UK", "US", "JP", "AU"), 2900, 4900),
)

DISCONTINUED_SKUS = (
    "DISCONTINUED-MUG-XMAS-2019",
    "DISCONTINUED-TEE-ORG-ORANGE-XS",
    "DISCONTINUED-CABLE-MICROUSB-1M",
    "DISCONTINUED-KB-MECH-ISO-FR",
)

VALID_TOKENS = ("tok_visa", "tok_mastercard", "tok_amex", "tok_visa_debit", "tok_jcb")
VALID_TOKEN_WEIGHTS = (45, 30, 12, 9, 4)

EMAIL_DOMAINS = ("example.com", "example.org", "example.net", "mail.example.com")


def build_catalogue(r: random.Random) -> dict[str, int]:
    """Fix one price per SKU, so a SKU costs the same in every order."""
    catalogue: dict[str, int] = {}
    for stem, variants, lo, hi in PRODUCTS:
        for variant in variants:
            price = r.randint(lo, hi)
            # Most prices end in 99 or 49, like a real shop.
            if price >= 500:
                price = price // 100 * 100 + r.choice([99, 99, 49, 0])
            catalogue[f"{stem}-{variant}"] = price
    return catalogue


def quantity(r: random.Random) -> int:
    """Mostly 1, sometimes a few, rarely a bulk order."""
    roll = r.random()
    if roll < 0.70:
        return 1
    if roll < 0.93:
        return r.randint(2, 4)
    return r.choice([6, 10, 12, 24, 50])


def make_items(
    r: random.Random, catalogue: dict[str, int], discontinued: bool
) -> list[dict[str, Any]]:
    """1–6 distinct lines; one of them discontinued when asked."""
    count = r.choices([1, 2, 3, 4, 5, 6], weights=[30, 28, 18, 12, 7, 5])[0]
    skus = r.sample(sorted(catalogue), count)
    items: list[dict[str, Any]] = [
        {"sku": sku, "quantity": quantity(r), "unit_price_cents": catalogue[sku]} for sku in skus
    ]
    if discontinued:
        line = {
            "sku": r.choice(DISCONTINUED_SKUS),
            "quantity": r.randint(1, 3),
            "unit_price_cents": r.choice([1299, 2499, 499, 3999]),
        }
        if len(items) >= 6:
            items[r.randrange(len(items))] = line
        else:
            items.insert(r.randint(0, len(items)), line)
    return items


def make_email(r: random.Random, person: Person) -> str:
    """Make an e-mail on a reserved example domain, with the odd ``+tag`` or capital."""
    local = person.handle
    roll = r.random()
    if roll < 0.10:
        local += "+" + r.choice(["shop", "orders", "treadle"])
    elif roll < 0.20:
        local += str(r.randint(1, 99))
    if r.random() < 0.05:
        local = local.capitalize()
    return f"{local}@{r.choice(EMAIL_DOMAINS)}"


def make_address(r: random.Random, country: Country, person: Person, bad: bool) -> dict[str, Any]:
    """Make a shipping address; ``bad`` makes it fail validation (no postcode/unsupported)."""
    city = r.choice(country.cities)
    address: dict[str, Any] = {
        "name": person.name,
        "line1": country.street(r),
        "line2": r.choice(country.line2) if r.random() < 0.35 else None,
        "city": city.name,
        "postal_code": city.postal(r),
        "country": country.code,
    }
    if r.random() < 0.15:
        del address["line2"]  # optional field: sometimes absent rather than null
    if bad:
        if r.random() < 0.5:
            # Supported country, but no postal code: empty, blank, or left out entirely.
            style = r.choice(["empty", "blank", "missing"])
            if style == "missing":
                del address["postal_code"]
            else:
                address["postal_code"] = "" if style == "empty" else "   "
        else:
            code, city_name, postal, street = r.choice(UNSUPPORTED)
            address.update(country=code, city=city_name, postal_code=postal, line1=street)
    return address


def make_order(
    r: random.Random, order_id: str, kind: Kind, catalogue: dict[str, int]
) -> dict[str, Any]:
    """One order of the given kind."""
    country = r.choice(COUNTRIES)
    # Most customers have a locally common name; some live abroad.
    pool = country.people if r.random() < 0.85 else r.choice(COUNTRIES).people
    person = r.choice(pool)
    if kind == "declined":
        token = r.choice(DECLINED_TOKENS)
    elif kind == "processing_error":
        token = PROCESSING_ERROR_TOKEN
    else:
        token = r.choices(VALID_TOKENS, weights=VALID_TOKEN_WEIGHTS)[0]
    return {
        "order_id": order_id,
        "customer_email": make_email(r, person),
        "items": make_items(r, catalogue, discontinued=kind == "discontinued"),
        "shipping_address": make_address(r, country, person, bad=kind == "bad_address"),
        "card_token": token,
        "express": r.random() < 0.25,
    }


# --- expected outcome (mirrors examples/orders.py) ----------------------------------------


def _fraction(*parts: object) -> float:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def inventory_exhausted(order_id: str) -> bool:
    """Tell whether the simulated inventory service fails every allowed attempt."""
    return all(
        _fraction("inventory", order_id, attempt) < 0.35 / attempt
        for attempt in range(1, INVENTORY_MAX_ATTEMPTS + 1)
    )


def expected_outcome(order: dict[str, Any]) -> tuple[Status, Reason]:
    """Return the terminal (status, reason) the ``orders`` workflow reaches for ``order``."""
    address = order["shipping_address"]
    if address["country"].upper() not in SUPPORTED_COUNTRIES:
        return "failed", "failure_non_retryable"
    if not address.get("postal_code", "").strip():
        return "failed", "failure_non_retryable"
    # reserve_inventory checks availability before stock, so it can run out of attempts.
    if inventory_exhausted(order["order_id"]):
        return "failed", "failure_attempts_exhausted"
    if any(item["sku"].startswith(DISCONTINUED_PREFIX) for item in order["items"]):
        return "failed", "failure_non_retryable"
    if order["card_token"] in DECLINED_TOKENS:
        return "failed", "failure_non_retryable"
    # tok_processing_error fails its first charge attempt only; 4 attempts are allowed.
    return "completed", "succeeded"


def new_order_id(r: random.Random, taken: set[str]) -> str:
    """Draw a unique id like ``ORD-7K2M9QXA`` (no 0/O/1/I).

    An id whose simulated inventory reservation would fail all its attempts is skipped,
    so that every order ends the way its kind intends.
    """
    alphabet = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"
    while True:
        candidate = "ORD-" + "".join(r.choice(alphabet) for _ in range(8))
        if candidate not in taken and not inventory_exhausted(candidate):
            taken.add(candidate)
            return candidate


def generate(seed: int = SEED, count: int = ORDER_COUNT) -> list[dict[str, Any]]:
    """Build the order list deterministically from ``seed``."""
    r = random.Random(seed)
    catalogue = build_catalogue(r)
    kinds: list[Kind] = [k for k, n in KIND_COUNTS.items() for _ in range(n)]
    kinds += ["valid"] * (count - len(kinds))
    r.shuffle(kinds)
    taken: set[str] = set()
    return [make_order(r, new_order_id(r, taken), kind, catalogue) for kind in kinds]


SHOWCASE_NAMES = ("Zoë Müller", "山田太郎", "Søren Ødegård")


def check_variety(orders: Sequence[dict[str, Any]]) -> list[str]:
    """List the showcase features missing from ``orders`` (empty when all are present)."""
    names = {o["shipping_address"]["name"] for o in orders}
    missing = [f"customer {n!r}" for n in SHOWCASE_NAMES if n not in names]
    if not any(
        any(ord(c) > 0xFFFF for c in o["shipping_address"].get("line2") or "") for o in orders
    ):
        missing.append("an emoji in some address line2")
    for flag in (True, False):
        if not any(o["express"] is flag for o in orders):
            missing.append(f"an order with express={flag}")
    return missing


def render(value: Any) -> str:
    """Stable JSON text: UTF-8 as is, two-space indent, trailing newline."""
    return json.dumps(value, ensure_ascii=False, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with ``--check``, verify) ``orders.json`` and ``orders.expected.json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    args = parser.parse_args(argv)

    orders = generate()
    missing = check_variety(orders)
    if missing:
        print("generated data lacks: " + "; ".join(missing), file=sys.stderr)
        return 1
    expected: dict[str, dict[str, str]] = {}
    for order in orders:
        status, reason = expected_outcome(order)
        expected[order["order_id"]] = {"status": status, "reason": reason}
    outputs = {ORDERS_PATH: render(orders), EXPECTED_PATH: render(expected)}

    if args.check:
        stale = [
            p.name
            for p, text in outputs.items()
            if not p.exists() or p.read_text(encoding="utf-8") != text
        ]
        if stale:
            print(f"stale: {', '.join(stale)} (run {Path(__file__).name})", file=sys.stderr)
            return 1
        print("up to date")
        return 0

    for path, text in outputs.items():
        path.write_text(text, encoding="utf-8")
    mix = Counter((v["status"], v["reason"]) for v in expected.values())
    print(f"wrote {len(orders)} orders to {ORDERS_PATH.name} and {EXPECTED_PATH.name}")
    for (final_status, final_reason), n in sorted(mix.items()):
        print(f"  {final_status:<10} {final_reason:<28} {n:>4}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
