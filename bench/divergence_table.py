"""The divergence suite's summary, per set of cases, as markdown: leads and false alarms.

Reads the rows `bench_divergence.py` writes (one per case, seed and
`every_n_batches`). For a diverging case: where it diverged and the first
warning's lead on each seed, their median and minimum, and the first
flag's lead apart. For a healthy case: its warnings (onsets, and steps at
which a warning was raised) and flags. Per set: the median lead over the
runs of the cases a warning could foresee, how many of them were warned
at least `AHEAD` steps ahead, and the healthy runs' warnings per 10,000
logged steps.
"""

# A warning this many steps before the divergence leaves time to act on it.
AHEAD = 10
PER_STEPS = 10_000


def first_onset(row, kind):
    """The earliest onset of `kind` ("warning" or "flag") in `row`, or None."""
    found = [o for o in row["onsets"] if o["class"] == kind]
    return min(found, key=lambda o: o["step"], default=None)


def lead_of(row, kind):
    """The first `kind` onset's lead in steps; None when none was raised."""
    first = first_onset(row, kind)
    return None if first is None else first["lead_steps"]


def _leads_text(leads, early=()):
    """The leads, those of onsets raised before the fault began marked with a dagger."""
    early = list(early) or [False] * len(leads)
    return " / ".join(
        ("none" if lead is None else str(lead)) + ("\N{DAGGER}" if soon else "")
        for lead, soon in zip(leads, early)
    )


def early(row, kind):
    """Whether the first `kind` onset came before the run's fault began (`cause_step`)."""
    first, cause = first_onset(row, kind), row.get("cause_step")
    return first is not None and cause is not None and first["step"] < cause


def _ordered(lead):
    """A missing warning sorts below every lead, a late one's negative lead included."""
    return -float("inf") if lead is None else lead


def _median_text(leads):
    """The median lead; of an even count, the lower of the two middle ones (a missing warning
    has no value to average)."""
    if not leads:
        return "-"
    middle = sorted(leads, key=_ordered)[(len(leads) - 1) // 2]
    return "none" if middle is None else str(middle)


def _min_text(leads):
    if not leads:
        return "-"
    low = min(leads, key=_ordered)
    return "none" if low is None else str(low)


def _where(onset):
    if onset is None:
        return "-"
    return f"`{onset['flag']}` {onset['step']} {onset['layer']}/{onset['tensor'] or '-'}"


def _cell(values):
    return " / ".join(str(v) for v in values)


def _diverged(found):
    return _cell("never" if r["divergence_step"] is None else r["divergence_step"] for r in found)


def _by_case(rows):
    cases = {}
    for row in rows:
        cases.setdefault(row["case"], []).append(row)
    for found in cases.values():
        found.sort(key=lambda r: r["seed"])
    return cases


def diverging_table(rows):
    """The markdown lines of a set's diverging cases, and its summary line."""
    lines = [
        "| case | diverges at | first warning's lead (steps) | median | min "
        "| first warning (rule, step, layer/tensor) | first flag's lead |",
        "|---|---|---|---|---|---|---|",
    ]
    foreseen, before = [], 0
    for case, found in _by_case(rows).items():
        leads = [lead_of(r, "warning") if r["divergence_step"] is not None else None for r in found]
        name = f"`{case}`" + ("" if found[0].get("foreseeable", True) else " (not foreseeable)")
        warned_early = [early(r, "warning") for r in found]
        flags = [lead_of(r, "flag") for r in found]
        lines.append(
            f"| {name} | {_diverged(found)} | {_leads_text(leads, warned_early)} "
            f"| {_median_text(leads)} | {_min_text(leads)} "
            f"| {'; '.join(_where(first_onset(r, 'warning')) for r in found)} "
            f"| {_leads_text(flags, [early(r, 'flag') for r in found])} |"
        )
        if found[0].get("foreseeable", True):
            foreseen.extend(leads)
            before += sum(warned_early)
    ahead = sum(lead is not None and lead >= AHEAD for lead in foreseen)
    summary = (
        f"Foreseeable runs: {len(foreseen)}; median lead of the first warning "
        f"**{_median_text(foreseen)}** steps, min {_min_text(foreseen)}; warned at least "
        f"{AHEAD} steps ahead in **{ahead} of {len(foreseen)}** (a missing warning counts "
        f"below any lead); in {before} of them the first warning came before the fault began "
        "(\N{DAGGER}: before the ramp's start or the corrupted batch, so not a sign of it)."
    )
    return lines, summary


def healthy_table(rows):
    """The markdown lines of a set's healthy cases, and its false-alarm summary line."""
    lines = [
        "| case | diverges | logged steps | warning onsets | warning-raised steps "
        "| warnings (rule, step, layer/tensor) | flag onsets |",
        "|---|---|---|---|---|---|---|",
    ]
    logged = onsets = raised = 0
    for case, found in _by_case(rows).items():
        warnings = [[o for o in r["onsets"] if o["class"] == "warning"] for r in found]
        flags = sorted({o["flag"] for r in found for o in r["onsets"] if o["class"] == "flag"})
        named = "; ".join(
            f"seed {r['seed']}: " + ", ".join(_where(o) for o in w)
            for r, w in zip(found, warnings)
            if w
        )
        lines.append(
            f"| `{case}` | {_diverged(found)} "
            f"| {_cell(r['logged_steps'] for r in found)} "
            f"| {_cell(len(w) for w in warnings)} "
            f"| {_cell(sum(o['raised_steps'] for o in w) for w in warnings)} "
            f"| {named or 'none'} | {', '.join(flags) or 'none'} |"
        )
        logged += sum(r["logged_steps"] for r in found)
        onsets += sum(len(w) for w in warnings)
        raised += sum(o["raised_steps"] for w in warnings for o in w)
    rate = (lambda n: f"{PER_STEPS * n / logged:.1f}") if logged else (lambda n: "-")
    summary = (
        f"Healthy runs: {logged:,} logged steps; {onsets} warning onsets "
        f"(**{rate(onsets)} per {PER_STEPS:,} logged steps**), {raised} warning-raised steps "
        f"({rate(raised)} per {PER_STEPS:,}). {per_seed(rows)}"
    )
    return lines, summary


def per_seed(rows):
    """The healthy runs' warning onsets per seed (all of that seed's healthy runs together),
    and their spread over seeds, per `PER_STEPS` logged steps."""
    seeds = {}
    for row in rows:
        found = seeds.setdefault(row["seed"], [0, 0])
        found[0] += sum(o["class"] == "warning" for o in row["onsets"])
        found[1] += row["logged_steps"]
    rates = sorted(PER_STEPS * n / steps for n, steps in seeds.values() if steps)
    if not rates:
        return ""
    cells = ", ".join(f"{seed}: {n} in {steps:,}" for seed, (n, steps) in sorted(seeds.items()))
    middle = rates[(len(rates) - 1) // 2]
    return (
        f"Per seed (onsets in logged steps): {cells}; per {PER_STEPS:,} steps over the "
        f"{len(rates)} seeds: min {rates[0]:.1f}, median {middle:.1f}, max {rates[-1]:.1f}."
    )


def markdown(rows, commands=()):
    """The summary of `rows` as markdown, under the `commands` that made them: per set and
    `every_n_batches`, its diverging cases then its healthy ones."""
    out = []
    for command in commands:
        out += [f"`{command}`", ""]
    digests = sorted({r.get("rules_digest") or "-" for r in rows})
    if len(digests) > 1:
        out += [
            f"**The rows were judged by {len(digests)} versions of the rules** "
            f"(`rules_digest` {', '.join(digests)}): rejudge them (`--rejudge`) to compare.",
            "",
        ]
    seeds = sorted({r["seed"] for r in rows})
    groups = {}
    for row in rows:
        groups.setdefault((row["set"], row["every_n_batches"]), []).append(row)
    for (name, every), found in groups.items():
        out += [
            f"### Set `{name}`, `every_n_batches={every}`, seeds {', '.join(map(str, seeds))}",
            "",
            "Each cell lists the seeds in order. Lead = divergence step - onset step "
            "(negative: after the divergence).",
            "",
        ]
        for expected, table in ((True, diverging_table), (False, healthy_table)):
            chosen = [r for r in found if r["expected_to_diverge"] == expected]
            if chosen:
                lines, summary = table(chosen)
                out += lines + ["", summary, ""]
    return "\n".join(out)
