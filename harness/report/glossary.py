"""The words the page uses before it explains them, defined at its end (docs/glossary.md has the longer list)."""

from __future__ import annotations

import html

#: term -> its definition, in the order a reader meets them on the page.
TERMS: dict[str, str] = {
    "label": "what groups a run's seeds: the method, the optimizer where it is not the suite's, the settings where "
             "the run departs from its method's other runs, and x<world size> (the number of ranks): 'sgd adamw x1' "
             "is sgd with AdamW on 1 process, 'pipedream replicas=2+1 x3' PipeDream on 3 processes with stage 0 on "
             "2 of them.",
    "train time": "wall time minus evaluation and checkpointing, measured the same way for every method.",
    "time to target": "the train time of a run's first evaluation at or past the suite's target (accuracy, or "
                      "held-out loss).",
    "censored time": "a run that never reached the target has only a lower bound on its time to target: its train "
                     "time. It is never taken as infinity; a speed-up against it is a bound (≥ or ≤). A diverged run "
                     "never reaches the target.",
    "baseline": "the label every other label of a workload is compared against (ddp by default).",
    "speed-up": "the baseline's time to target over the label's, paired by seed.",
    "interval": "over seeds: of a mean, with 3 or more seeds a bootstrap interval, with 2 the min–max of the two "
                "(the sentence at the top of the page says which this page shows); of a speed-up or a claim, a "
                "paired Student-t interval on the per-seed log ratios (or differences).",
    "IQM": "the interquartile mean: the mean of the middle 50% of a label's runs on one workload (rliable), less "
           "swayed by one odd seed than the mean.",
    "probability of improvement": "P(... better than baseline): the chance that a run of the label beats a run of "
                                  "its workload's baseline on the same workload and network; 0.5 is a draw.",
    "identical on every seed": "labels whose final accuracy and held-out loss agree to within 1e-6 on each seed: "
                               "one training trajectory (the same updates in another schedule or placement), so "
                               "only their times differ.",
    "Kaplan–Meier curve": "the fraction of a label's seeds at the target against train time, a step up each time a "
                          "seed reaches it; a seed that missed is censored at its train time (a tick), a diverged "
                          "one never arrives (an x), so a curve that ends below 1 has seeds that never arrived.",
    "noisy run": "a run whose ranks were starved of CPU by other processes while it ran: its times are flagged.",
    "1F1B": "a pipeline schedule in which, after a warm-up, each stage alternates one forward and one backward "
            "(GPipe runs every forward, then every backward); both flush (update together) once per batch.",
    "bubble": "the fraction of a pipeline step that the ranks sit idle waiting for each other: 1 − (mean busy time) "
              "/ (the step's span), from each step's trace.",
    "bytes per sample": "all ranks' bytes on the wire, counted where they are sent, over the samples trained.",
}


def glossary_html() -> str:
    """The page's glossary section: a definition list of TERMS."""
    items = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>" for term, text in TERMS.items())
    return f'<h2 id="glossary">Words used on this page</h2>\n<dl class="glossary">{items}</dl>\n'
