"""`GradVizCallback(stop_on=...)`: stop `fit` after a log event that raised a flag or a warning.

The callback judges each log event once (`judgement.Judge`, by the rules
`/onset` and `tb-gradviz check` apply, over the columns both sides build
with `rule_columns.build`); `StopOn` reads that judgement. So a fit stopped
on a flag or a warning at step `s` is one that `/onset` and `check` name at
step `s` too.
"""


class StopOn:
    """Says, from each log event's judgement, whether to stop (`stops`)."""

    def __init__(self, names, predicate):
        self.names, self.predicate = names, predicate

    @property
    def active(self):
        """Whether anything is asked: the callback judges the warnings only then."""
        return bool(self.names) or self.predicate is not None

    def stops(self, judgement):
        """Whether to stop training after an event with this `judgement.Judgement`: it raised
        one of `names`, or the predicate returned True for what it raised."""
        if not self.active:
            return False
        raised = judgement.raised
        if self.predicate is not None:
            return bool(self.predicate(raised)) if raised else False
        return any(entry["flag"] in self.names for entry in raised)

    def stop(self, model, step, judgement):
        """Stops `model`'s fit after the event at `step`, saying what it raised; returns that."""
        raised = judgement.raised
        named = ", ".join(f"{r['flag']} ({r['layer']}, {r['tensor']})" for r in raised)
        print(f"GradVizCallback: step {step}: raised {named}; stopping training")
        model.stop_training = True
        return raised
