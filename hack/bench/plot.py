"""Draws one benchmark run as a PNG: requests answered and requests failed per 100 ms (from
examples/roll_load.rs's --timeline CSV), with the run's phases marked (from a JSON-lines file:
{"at": unix, "label": ...} draws a vertical line, one colour per label, in the legend;
{"from": unix, "to": unix, "label": ...} shades a span and names it at the top).

Used by hack/bench/roll.sh and hack/bench/failover.sh (matplotlib in the venv they make):
  python plot.py --timeline timeline.csv --marks marks.jsonl --title TEXT --out run.png
"""
import argparse
import csv
import json
from collections import Counter

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BIN = 0.1
# Failure kinds in a fixed order and colour, so pictures of different runs compare.
KIND_COLOURS = {"refused": "#d62728", "reset": "#ff7f0e", "closed": "#9467bd", "timeout": "#8c564b",
                "tls": "#e377c2", "other": "#7f7f7f"}
MARK_COLOURS = ["#2ca02c", "#d62728", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timeline", required=True)
    p.add_argument("--marks")
    p.add_argument("--title", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    rows = list(csv.DictReader(open(a.timeline)))
    if not rows:
        raise SystemExit(f"plot.py: {a.timeline} has no requests")
    t0 = min(float(r["at"]) for r in rows)
    ok, failed = Counter(), {}
    for r in rows:
        b = int((float(r["at"]) - t0) / BIN)
        if r["outcome"] == "ok":
            ok[b] += 1
        else:
            failed.setdefault(r["outcome"], Counter())[b] += 1
    last = max(ok.keys() | {b for c in failed.values() for b in c}) + 1
    xs = [b * BIN for b in range(last)]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 4.2), dpi=72, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1.3]})
    top.plot(xs, [ok[b] for b in range(last)], lw=0.6, color="#1f77b4", label="answered (2xx)")
    top.set_ylabel("requests / 100 ms")
    total_failed = 0
    bottom_stack = [0] * last
    for i, (kind, counts) in enumerate(sorted(failed.items())):
        ys = [counts[b] for b in range(last)]
        total_failed += sum(ys)
        colour = KIND_COLOURS.get(kind, MARK_COLOURS[i % len(MARK_COLOURS)])
        bottom.bar(xs, ys, width=BIN, bottom=bottom_stack, color=colour, label=f"{kind} ({sum(ys)})", align="edge")
        bottom_stack = [s + y for s, y in zip(bottom_stack, ys)]
    bottom.set_ylabel("failed / 100 ms")
    bottom.set_xlabel("seconds since the load began")
    if total_failed == 0:
        bottom.text(0.5, 0.5, f"0 failed of {len(rows):,} requests", transform=bottom.transAxes,
                    ha="center", va="center", fontsize=11)
        bottom.set_ylim(0, 1)
    else:
        bottom.legend(loc="upper right", fontsize=8, title=f"{total_failed} failed of {len(rows):,}",
                      title_fontsize=8)

    colours = {}
    for line in open(a.marks) if a.marks else []:
        m = json.loads(line)
        if "from" in m:
            x0, x1 = m["from"] - t0, m["to"] - t0
            for ax in (top, bottom):
                ax.axvspan(x0, x1, color="#000000", alpha=0.06, lw=0)
            top.text((x0 + x1) / 2, 1.01, m["label"], transform=top.get_xaxis_transform(), ha="center",
                     va="bottom", fontsize=7)
        else:
            label = m["label"]
            if label not in colours:
                colours[label] = MARK_COLOURS[len(colours) % len(MARK_COLOURS)]
            for ax in (top, bottom):
                ax.axvline(m["at"] - t0, color=colours[label], lw=0.9, ls="--",
                           label=label if ax is top and not any(h == label for h in seen(top)) else None)
    top.legend(loc="lower left", fontsize=8, ncol=4)
    top.set_ylim(bottom=0)
    top.set_xlim(0, last * BIN)
    fig.suptitle(a.title, fontsize=10, y=0.995)
    fig.tight_layout()
    fig.savefig(a.out, dpi=72)
    print(f"plot.py: wrote {a.out} ({len(rows):,} requests, {total_failed} failed)")


def seen(ax):
    return [line.get_label() for line in ax.get_lines()]


if __name__ == "__main__":
    main()
