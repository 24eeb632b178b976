"""A parameterised task for the workers (README: "Running many tasks: workers").

    overnight submit examples/report.py --param topic=storage --param sections=4
    overnight worker --idle-exit 10

``ctx.params`` holds the submission's parameters; each submission with other params is its own
task (``report-<8 hex digits of the params>``, or ``--id``).
"""

import time

import overnight

task = overnight.Task("report", goal="a short report on a topic, one section per step", data={"words": 0})


@task.step
def plan(ctx):
    for i in range(int(ctx.params.get("sections", 3))):
        ctx.add_step("section", i=i)  # each runs right after plan, before assemble


@task.step(planned=False)
def section(ctx, i: int):
    topic = ctx.params.get("topic", "storage")
    time.sleep(float(ctx.params.get("seconds", 1)))  # stands for a model call
    text = f"## {topic}: part {i + 1}\n\nWhat part {i + 1} says about {topic}.\n"
    ctx.write_text(f"sections/{i:02d}.md", text)
    ctx.state["words"] += len(text.split())


@task.step
def assemble(ctx):
    names = sorted(n for n in ctx.artifact_names() if n.startswith("sections/"))
    ctx.write_text("report.md", f"# {ctx.params.get('topic', 'storage')}\n\n"
                   + "\n".join(ctx.read_text(n) for n in names))
    return {"sections": len(names), "words": ctx.state["words"]}
