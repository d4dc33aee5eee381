"""Draws one benchmark run as a PNG: requests answered and requests failed per time bin (from
examples/roll_load.rs's --timeline CSV), with the run's phases marked (from a JSON-lines file:
{"at": unix, "label": ...} draws a vertical line in the legend, coloured by what it marks;
{"from": unix, "to": unix, "label": ...} shades a span and names it at the top; a span with
"kind": "preflight" is shaded apart and in the legend).

A bin is 100 ms, or wider on a long run, so that no bin is narrower than a pixel. --title says
what the run is, and the plot adds its finding (how many requests failed); --made-by (the
command, the kcpshard commit and the date) is printed small below.

Used by hack/bench/roll.sh, move.sh and failover.sh (matplotlib in the venv they make):
  python plot.py --timeline timeline.csv --marks marks.jsonl --title TEXT --made-by TEXT --out run.png
"""
import argparse
import csv
import json
from collections import Counter

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# How many bins fit the plot's width (11 in at 72 dpi, less the margins).
MAX_BINS = 650
# Failure kinds in a fixed order and colour, so pictures of different runs compare: warm colours,
# which no mark uses.
KIND_COLOURS = {"refused": "#d62728", "reset": "#ff7f0e", "closed": "#e377c2", "timeout": "#8c564b",
                "tls": "#ff9896", "http-500": "#b2182b", "other": "#7f7f7f"}
OTHER_KINDS = ["#fdae61", "#f46d43", "#a50026", "#c51b7d"]
# Marks by what they mean, the same colour in every picture: green when something new is ready,
# blue when traffic moves, purple when something old goes, black for a fault.
MARK_COLOURS = {"new slot ready": "#2ca02c", "copied, new slot started": "#2ca02c",
                "workspace Ready": "#2ca02c", "back to 1 ready": "#98df8a", "back to 2 ready": "#98df8a",
                "front switched": "#1f77b4", "switch began": "#aec7e8", "switched": "#1f77b4",
                "out of the front": "#1f77b4", "old slot exited": "#9467bd",
                "SIGKILL of the leading slot": "#000000", "SIGSTOP of the leading slot": "#555555"}
OTHER_MARKS = ["#17becf", "#bcbd22", "#7f7f7f"]
PREFLIGHT_COLOUR = "#ff7f0e"


def bin_width(seconds):
    """The narrowest of 0.1, 0.2, 0.5, 1, 2, 5 s that keeps the run within MAX_BINS bins."""
    return next((w for w in (0.1, 0.2, 0.5, 1.0, 2.0) if seconds / w <= MAX_BINS), 5.0)


def per_bin(width):
    return f"{width * 1000:.0f} ms" if width < 1 else f"{width:g} s"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timeline", required=True)
    p.add_argument("--marks")
    p.add_argument("--title", required=True)
    p.add_argument("--made-by", default="")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    rows = list(csv.DictReader(open(a.timeline)))
    if not rows:
        raise SystemExit(f"plot.py: {a.timeline} has no requests")
    t0 = min(float(r["at"]) for r in rows)
    width = bin_width(max(float(r["at"]) for r in rows) - t0)
    ok, failed = Counter(), {}
    for r in rows:
        b = int((float(r["at"]) - t0) / width)
        if r["outcome"] == "ok":
            ok[b] += 1
        else:
            failed.setdefault(r["outcome"], Counter())[b] += 1
    last = max(ok.keys() | {b for c in failed.values() for b in c}) + 1
    xs = [b * width for b in range(last)]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 4.4), dpi=72, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1.3]})
    top.step(xs, [ok[b] for b in range(last)], where="post", lw=0.7, color="#4d4d4d", label="answered (2xx)")
    top.set_ylabel(f"answered / {per_bin(width)}")
    total_failed = 0
    bottom_stack = [0] * last
    for i, (kind, counts) in enumerate(sorted(failed.items())):
        ys = [counts[b] for b in range(last)]
        total_failed += sum(ys)
        colour = KIND_COLOURS.get(kind, OTHER_KINDS[i % len(OTHER_KINDS)])
        bottom.bar(xs, ys, width=width, bottom=bottom_stack, color=colour, label=f"{kind} ({sum(ys)})", align="edge")
        bottom_stack = [s + y for s, y in zip(bottom_stack, ys)]
    bottom.set_ylabel(f"failed / {per_bin(width)}")
    bottom.set_xlabel("seconds since the load began")
    if total_failed == 0:
        bottom.text(0.5, 0.5, f"0 failed of {len(rows):,} requests", transform=bottom.transAxes,
                    ha="center", va="center", fontsize=11)
        bottom.set_ylim(0, 1)
    else:
        bottom.legend(loc="upper right", fontsize=8, title=f"{total_failed} failed of {len(rows):,}",
                      title_fontsize=8)

    others = {}
    for line in open(a.marks) if a.marks else []:
        m = json.loads(line)
        if "from" in m:
            x0, x1 = m["from"] - t0, m["to"] - t0
            preflight = m.get("kind") == "preflight"
            for ax in (top, bottom):
                ax.axvspan(x0, x1, color=PREFLIGHT_COLOUR if preflight else "#000000", alpha=0.12 if preflight else 0.06,
                           lw=0, label=m["label"] if preflight and ax is top and m["label"] not in seen(top) else None)
            if not preflight:
                top.text((x0 + x1) / 2, 1.01, m["label"], transform=top.get_xaxis_transform(), ha="center",
                         va="bottom", fontsize=7)
        else:
            label = m["label"]
            colour = MARK_COLOURS.get(label) or others.setdefault(label, OTHER_MARKS[len(others) % len(OTHER_MARKS)])
            for ax in (top, bottom):
                ax.axvline(m["at"] - t0, color=colour, lw=0.9, ls="--",
                           label=label if ax is top and label not in seen(top) else None)
    top.legend(loc="lower left", fontsize=8, ncol=5, framealpha=0.9)
    top.set_ylim(bottom=0)
    top.set_xlim(0, last * width)
    finding = (f"{total_failed:,} of {len(rows):,} requests failed" if total_failed
               else f"none of {len(rows):,} requests failed")
    fig.suptitle(f"{a.title}: {finding}", fontsize=11, y=0.995)
    fig.tight_layout(rect=(0, 0.03 if a.made_by else 0, 1, 1))
    if a.made_by:
        fig.text(0.995, 0.005, a.made_by, ha="right", va="bottom", fontsize=7, color="#777777")
    fig.savefig(a.out, dpi=72)
    print(f"plot.py: wrote {a.out} ({len(rows):,} requests, {total_failed} failed)")


def seen(ax):
    return [artist.get_label() for artist in ax.get_lines() + ax.patches]


if __name__ == "__main__":
    main()
