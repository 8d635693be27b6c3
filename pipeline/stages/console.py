"""`iteragpu`: the lab's one command, a subcommand for each thing a user does.

    iteragpu predict --hf-config config.json --task training --dtype bfloat16 --batch 4 \\
        --dim sequence=2048 --gpu h200 --json > predicted.json      # no GPU needed
    iteragpu fit predicted.json --days 7                            # which package holds it
    iteragpu plan --search batch --days 7 -- --hf-config config.json --task training  # the
                                                        # largest batch each GPU holds
    iteragpu measure --device cuda:0 --hf-config config.json ...    # on the GPU

Each subcommand is a stage's own command line (`iteragpu SUBCOMMAND --help`), with its exit
codes: 0 done, 1 a check failed, 2 bad input or a missing prerequisite, 3 out of memory. In a
clone of the repository, `python3 -m pipeline.measuring.own_model estimate ...` and the nox
sessions run the same stages.
"""

from __future__ import annotations

import importlib
import sys

from pipeline.core import cli, places

# subcommand: (the stage's module, the arguments put before the user's, what it does)
COMMANDS = {
    "predict": (
        "pipeline.measuring.own_model",
        ["estimate"],
        "predict a model's GPU memory, no GPU needed",
    ),
    "measure": (
        "pipeline.stages.chain",
        [],
        "measure on a GPU into a new runs/<id>/ folder",
    ),
    "plan": (
        "pipeline.stages.plan",
        [],
        "the largest batch (or length) each rental GPU holds, no GPU needed",
    ),
    "fit": (
        "pipeline.stages.fit",
        [],
        "which rental GPU holds a prediction's peak, at what price",
    ),
    "cost": ("pipeline.calcul_forfaits", [], "price a rental package, or compare them all"),
    "sweep": ("pipeline.stages.sweep", [], "raise one dimension on a GPU to out of memory"),
    "report": ("pipeline.stages.report", [], "draw memory, sweep and cost pictures of runs"),
    "validate": ("pipeline.artefacts.validate", [], "check files, run folders or results logs"),
    "verify": ("pipeline.kit.verify", [], "check a kit zip or folder against MANIFEST.json"),
}
# The stages that read the tariffs: an installed package passes its own copy on, since the
# default (beside calcul_forfaits.py, or ../data/) is where a clone keeps it.
TARIFFED = {"cost", "fit", "plan", "report"}


def parser() -> cli.Parser:
    parser = cli.Parser(
        prog="iteragpu",
        description="IteraGPU Lab: predict, measure and price the GPU memory of a PyTorch "
        "workload.",
        epilog="`iteragpu SUBCOMMAND --help` shows a subcommand's own options.",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="SUBCOMMAND", parser_class=cli.Parser
    )
    for name, (_, _, what) in COMMANDS.items():
        commands.add_parser(name, help=what, add_help=False)
    return parser


def dispatch(argv: list[str] | None) -> int:
    """The subcommand is the first argument; every one after it is the stage's own."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv[:1])
    module, leading, _ = COMMANDS[args.command]
    given = argv[1:]
    chosen = any(arg.split("=")[0] == "--tariffs" for arg in given)
    if args.command in TARIFFED and places.installed() and not chosen:
        # first: a stage that hands what follows `--` to another (plan) takes it as its own
        given = ["--tariffs", str(places.folder("data") / "tarifs-forfaits.csv"), *given]
    return importlib.import_module(module).main([*leading, *given])


def main(argv: list[str] | None = None) -> int:
    return cli.run("iteragpu", lambda: dispatch(argv))


if __name__ == "__main__":
    sys.exit(main())
