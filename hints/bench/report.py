"""One writer for the sweep reports (the scaling ladder, the hint-corpus ablation): a Markdown
table, CSV, JSON and plots of the same rows, in one folder, named after the report."""
import csv
import json
import os


def markdown_table(header, rows):
    """A Markdown table: a header row, a rule, then one row of cells per entry of `rows`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(out_dir, name, rows, table, plots=(), **extra):
    """Write <name>.md (the table), <name>.csv (the rows), <name>.json (the rows, plus `extra`) and
    one PNG per (file name, draw(ax-figure)) in `plots`. Returns the list of files written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []

    def path(filename):
        written.append(os.path.join(out_dir, filename))
        return written[-1]

    with open(path(f"{name}.md"), "w") as f:
        f.write(table + "\n")
    with open(path(f"{name}.csv"), "w", newline="") as f:
        fields = list(dict.fromkeys(k for r in rows for k in r))
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    with open(path(f"{name}.json"), "w") as f:
        json.dump(dict(extra, rows=rows), f, indent=1)
    if plots:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        for filename, draw in plots:
            fig = draw(plt)
            fig.tight_layout()
            fig.savefig(path(filename), dpi=120)
            plt.close(fig)
    return written
