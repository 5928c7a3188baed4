"""`tb-gradviz check`: training-health flags per run and layer; a status for CI."""

import sys

from tb_gradviz.cli.logs import open_logdir, runs_of
from tb_gradviz.cli.status import EXIT_FLAGGED
from tb_gradviz.cli.summary import table


def run_check(args):
    gradviz, ctx, experiment = open_logdir(args.logdir)
    raised = []
    for run in runs_of(gradviz, ctx, experiment, args.logdir, args.run):
        snapshot = gradviz.step_impl(ctx, experiment, run["run"], None, args.ratio)
        rows = [
            (
                layer["layer"],
                flag["flag"],
                "yes" if flag["flag"] in args.fail_on else "no",
                flag["detail"],
            )
            for layer in snapshot["layers"]
            for flag in layer["flags"]
        ]
        raised += [row for row in rows if row[2] == "yes"]
        reference = snapshot["health"]["reference_layer"]
        print(f"run {run['run']}  (step {snapshot['step']}, reference layer {reference or '-'})")
        print(table(rows, ("layer", "flag", "fails", "detail")) if rows else "no flag raised")
        if all(layer["units"] is None for layer in snapshot["layers"]):
            print("(dead units not recorded: the run was written before tb_gradviz recorded them)")
        print()
    if raised:
        print(
            f"{len(raised)} flag(s) among --fail-on {','.join(args.fail_on)} raised",
            file=sys.stderr,
        )
        return EXIT_FLAGGED
    return 0
