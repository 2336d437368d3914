"""The demo's sample documents and the words its analysis leaves out."""

from __future__ import annotations

from pathlib import Path

__all__ = ["MARKER", "SAMPLES", "STOPWORDS", "write_samples"]

MARKER = ".perdure-demo"  # the file that says a folder was made by the demo

SAMPLES: dict[str, str] = {
    "01-lighthouse.txt": (
        "Keeper's log, north point light. The lamp was cleaned at dusk and the lens turned "
        "without a catch. Fog came in from the east after midnight, so the horn ran for four "
        "hours. Two fishing boats passed close to the reef; both answered the horn. The oil "
        "store is half full. The stair rail on the third landing is loose again and needs a "
        "new bracket before the winter storms. Lamp, lens and horn all in order at dawn."
    ),
    "02-garden.txt": (
        "Community garden plan for spring. The north beds get beans and peas on the old "
        "trellis; the south beds, which see the most sun, get tomatoes and peppers. Compost "
        "from the autumn pile is ready and will be spread in March. Volunteers asked for a "
        "rota for watering, and for a second tap near the gate. The tool shed roof leaks over "
        "the seed shelf, so seeds move to the dry crate until the roof is mended."
    ),
    "03-bridge.txt": (
        "Inspection note, footbridge over the mill stream. Deck boards are sound apart from "
        "two near the east abutment, which show soft rot and should be replaced. The steel "
        "handrail has surface rust at the joints; wire brush and repaint. Bearings move "
        "freely. Scour around the west pier is slight and has not grown since the last "
        "inspection. The bridge stays open; replace the two boards within a month."
    ),
    "04-bakery.txt": (
        "Letter to the flour mill. Our last three deliveries arrived a day late, and the rye "
        "flour in the second one was damp at the bottom of the sacks. We bake from four in "
        "the morning, so a late delivery means no rye bread that day. Could deliveries come "
        "on Monday and Thursday afternoons instead? We would also like to try your spelt "
        "flour; please send two sacks with the next rye order."
    ),
    "05-library.txt": (
        "Moving the branch library. The new rooms above the post office are larger but the "
        "floor must be checked for the weight of full shelves. Children's books move first, "
        "so the reading hour can restart soon. The local history collection moves last and "
        "by hand, box by box, because many of the maps are fragile. Returns can be left at "
        "the post office counter during the move."
    ),
    "06-river.txt": (
        "River survey, upper reach. Water was clear and cold; flow was higher than in the "
        "summer survey after a week of rain. Trout were seen in three of the five pools. The "
        "gravel bar below the weir has shifted towards the left bank. Willow planted on the "
        "bank last year has taken well and holds the soil. Litter was found at the footpath "
        "crossing; a bin there would help."
    ),
}

_STOPWORDS_TEXT = """
    a about after again all also an and any are as at be because been before both but by
    can come could day for from get gets has have in into is it its last like many may
    means more most move moves must near needs new next not of on one or our over please
    see seen should since so some than that the their them then there these they this
    those three through to two until up was we were when which will with within without
    would year you your
"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())


def write_samples(folder: Path) -> list[str]:
    """Write the sample documents into ``folder/docs`` unless it holds some already."""
    docs = folder / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    marker = folder / MARKER
    if not marker.exists():
        marker.write_text("made by `perdure demo`; safe to delete\n", encoding="utf-8")
    if not any(docs.glob("*.txt")):
        for name, text in SAMPLES.items():
            (docs / name).write_text(text + "\n", encoding="utf-8")
    return sorted(p.name for p in docs.glob("*.txt"))
