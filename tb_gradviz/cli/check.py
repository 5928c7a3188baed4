"""`tb-gradviz check`: training-health flags per run and layer, and where each began."""

import sys

from tb_gradviz.board import loss_scale
from tb_gradviz.cli.export import write_json
from tb_gradviz.cli.logs import open_logdir, runs_of
from tb_gradviz.cli.status import EXIT_FLAGGED, EXIT_OK, EXIT_USAGE
from tb_gradviz.cli.summary import table

CHECK_FORMAT_VERSION = 1
FLAG_COLUMNS = ("layer", "flag", "tensor", "fails", "detail")
ONSET_COLUMNS = ("flag", "class", "fails", "first step", "layer", "tensor", "persists", "raised at")


def run_check(args):
    """Judges each run at its last step and finds each flag's onset; returns the exit status."""
    from tensorboard import errors

    gradviz, ctx, experiment = open_logdir(args.logdir)
    results, status = [], EXIT_OK
    for run in runs_of(gradviz, ctx, experiment, args.logdir, args.run):
        try:
            snapshot, onsets = gradviz.check_impl(ctx, experiment, run["run"], args.ratio)
        except errors.NotFoundError as e:
            results.append({"run": run["run"], "error": str(e)})
            status = EXIT_USAGE
            continue
        result = check_result(snapshot, onsets, args.fail_on)
        result["loss_scale"] = gradviz.loss_scale_impl(ctx, experiment, run["run"])
        results.append(result)
        # A flag fails while raised at the last step, a warning once raised at any step.
        warned = [o for o in result["onsets"] if o.get("class") == "warning" and o["fails"]]
        if status == EXIT_OK and (any(f["fails"] for f in result["flags"]) or warned):
            status = EXIT_FLAGGED
    if args.format == "json":
        write_json(
            {
                "format_version": CHECK_FORMAT_VERSION,
                "status": status,
                "fail_on": list(args.fail_on),
                "ratio": args.ratio,
                "runs": results,
            },
            sys.stdout,
        )
    else:
        _print_text(results, args.fail_on)
    return status


def check_result(snapshot, onsets, fail_on):
    """One run's part of `check --format json` (docs/CLI.md).

    Args:
      snapshot: the run's flags at its last step (`GradVizPlugin.check_impl`).
      onsets: its `/onset` body.
      fail_on: the flags that fail the check.
    """
    return {
        "run": snapshot["run"],
        "step": snapshot["step"],
        "reference_layer": snapshot["health"]["reference_layer"],
        "units_recorded": any(layer["units"] is not None for layer in snapshot["layers"]),
        "flags": [
            {
                "layer": layer["layer"],
                "flag": flag["flag"],
                "tensor": flag.get("tensor"),
                "fails": flag["flag"] in fail_on,
                "detail": flag["detail"],
            }
            for layer in snapshot["layers"]
            for flag in layer["flags"]
        ],
        "onsets": [dict(onset, fails=onset["flag"] in fail_on) for onset in onsets["onsets"]],
    }


def _print_text(results, fail_on):
    failing = 0
    for result in results:
        if "error" in result:
            print(f"run {result['run']}: {result['error']}\n")
            continue
        reference = result["reference_layer"] or "-"
        print(f"run {result['run']}  (step {result['step']}, reference layer {reference})")
        rows = [
            (f["layer"], f["flag"], f["tensor"] or "-", _yes(f["fails"]), f["detail"])
            for f in result["flags"]
        ]
        failing += sum(f["fails"] for f in result["flags"])
        failing += sum(o["fails"] for o in result["onsets"] if o.get("class") == "warning")
        print(table(rows, FLAG_COLUMNS) if rows else "no flag raised")
        if not result["units_recorded"]:
            print("(dead units not recorded: the run was written before tb_gradviz recorded them)")
        if result["onsets"]:
            print(
                "\nonset  (the first step each flag or warning was raised, and where it began: "
                "the first tensor that raised it in the order the step computed them)"
            )
            print(
                table(
                    [
                        (
                            o["flag"],
                            o.get("class", "flag"),
                            _yes(o["fails"]),
                            str(o["step"]),
                            o["layer"],
                            o["tensor"] or "-",
                            _yes(o["persists"]),
                            f"{o['raised_steps']} step(s), last {o['last_raised_step']}",
                        )
                        for o in result["onsets"]
                    ],
                    ONSET_COLUMNS,
                )
            )
            for o in result["onsets"]:
                if o.get("remedy"):
                    print(f"  {o['flag']} at {o['layer']} ({o['tensor']}): {o['remedy']}")
        if result.get("loss_scale"):
            print("\n" + loss_scale.line(result["loss_scale"]))
        print()
    missing = [r["run"] for r in results if "error" in r]
    if missing:
        print(f"no data to judge in run(s) {', '.join(missing)}", file=sys.stderr)
    if failing:
        print(f"{failing} flag(s) among --fail-on {','.join(fail_on)} raised", file=sys.stderr)


def _yes(value):
    return "yes" if value else "no"
