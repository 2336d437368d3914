"""Composition: a parent delegates to children, gathers steps and children, refines its intent.

Run it: python examples/composition.py
Object ``digest-1`` delegates one ``summarise`` child per document and joins them, then
gathers a step and two more children at once, refines its own goal, and returns. Each
child is an object of its own (id ``digest-1.<position>``) that any node may run; the
parent is dormant while it waits and wakes once, when all it waits for are done.
"""

from pathlib import Path

import perdure

app = perdure.App(store="sqlite:///composition.db", key_dir=".perdure-keys")


def count_words(text: str) -> int:
    return len(text.split())


def first_words(text: str) -> str:
    return " ".join(text.split()[:3])


@app.agent()
async def summarise(run: perdure.Run, text: str) -> dict:
    words = await run.step(count_words, text)
    return {"words": words, "start": await run.step(first_words, text)}


@app.agent()
async def digest(run: perdure.Run, docs: list[str]) -> dict:
    children = [await run.delegate(summarise, doc) for doc in docs]
    summaries = await run.join(*children)  # dormant until every child is done

    total, extra_a, extra_b = await run.gather(
        run.step(count_words, " ".join(docs)),
        await run.delegate(summarise, "one more document to read"),
        await run.delegate(summarise, "and the very last one"),
    )
    intent = await run.refine(goal={"documents": len(docs) + 2})
    return {"summaries": summaries, "total": total, "extra": [extra_a, extra_b],
            "goal": intent.goal, "intent_version": intent.version_no}


if __name__ == "__main__":
    for leftover in Path().glob("composition.db*"):  # each run starts over
        leftover.unlink()
    with app.background_worker():
        handle = app.options(object_id="digest-1").start(
            digest, ["the tide comes in", "the tide goes out again"])
        print(handle.result(timeout=30))
    for child in reversed(app.list(parent="digest-1")):
        print(child.object_id, f"{child.agent}@{child.agent_version}", child.status)
    app.close()
