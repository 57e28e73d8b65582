#!/usr/bin/env bash
# Checks that every measured figure in README.md (or in the Markdown files given) cites the
# results file it comes from, and that the file holds it:
#
#   scripts/check-figures.sh [FILE.md ...]      # default: README.md
#
# The convention (README.md, "Figures"): a figure is a number, or numbers joined by "/", "–"
# or ",", followed by a unit: ms, s, MiB, KiB, GiB, requests (e.g. "207 / 223 / 253 ms",
# "13.9–18.2 s"). Each one is cited in its paragraph, or, in a table, in the paragraph just
# before the table, by
#
#   (DATE, Kubernetes VERSION, CLIENT; bench/results/FILE.md)
#
# e.g. "(2026-12-02, Kubernetes 1.20.2, client-go 1.20; bench/results/node-delete-rounds-2026-12-02-k8s-1.20.2.md)".
# A paragraph or table may cite several files; each figure must then be in one of them.
# Text in backticks and in code blocks is not a figure (settings: `15 s / 10 s / 2 s`).
#
# A pasted results block (a bench report copied as printed) may instead be cited once, for its
# whole section, by a paragraph that starts with "Every figure in this section:" followed by its
# citations. They then cover every paragraph and table from that paragraph to the next heading
# of the same or a higher level (subsections included), in addition to a block's own citations;
# each figure's numbers must still be in one of the files cited for it.
#
# Fails (exit 1), naming file, line and figure, when: a paragraph or table has a figure and no
# citation; a cited file is missing; a cited file does not name the citation's date and
# Kubernetes version; a number of a figure is in none of the cited files.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$#" -gt 0 ] || set -- README.md
exec python3 - "$@" <<'PY'
import os, re, sys

UNIT = r"(?:ms|s|MiB|KiB|GiB|requests?(?:/min|/s)?|req(?:uests)?/(?:min|s))"
NUM = r"\d[\d.,]*\d|\d"
FIGURE = re.compile(r"(?<![\w.])((?:%s)(?:[ \t]*(?:–|-|/|,)[ \t]*(?:%s))*)[ \t]*%s(?![\w/])" % (NUM, NUM, UNIT))
CITATION = re.compile(
    r"\(\s*(\d{4}-\d{2}-\d{2}),\s*Kubernetes\s+(\d+\.\d+\.\d+),\s*([^;()]+?);\s*(bench/results/[^\s;()]+\.md)\s*\)"
)

def blank_code(text):
    """Blanks code blocks and inline code, keeping offsets and newlines."""
    out, fence = [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fence = not fence
            out.append(re.sub(r"[^\n]", " ", line))
        elif fence:
            out.append(re.sub(r"[^\n]", " ", line))
        else:
            out.append(re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), line))
    return "".join(out)

def blocks(text):
    """(start, end, is_table) of each paragraph or table."""
    res, start, pos, kind = [], None, 0, None
    for line in text.splitlines(keepends=True):
        t = line.strip()
        k = None if not t else ("table" if t.startswith("|") else "para")
        if k != kind and start is not None:
            res.append((start, pos, kind == "table"))
            start = None
        if k is not None and start is None:
            start = pos
        kind = k
        pos += len(line)
    if start is not None:
        res.append((start, pos, kind == "table"))
    return res

def numbers(fig):
    return [n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?", fig)]

def holds(content, n):
    return re.search(r"(?<![\d.])%s(?![\d])" % re.escape(n), content) is not None

SECTION = "Every figure in this section:"
HEADING = re.compile(r"^(#{1,6})[ \t]", re.M)

def sections(text, bl):
    """(start, end, para_start, para_end) of each section cited by a SECTION paragraph."""
    heads = [(m.start(), len(m.group(1))) for m in HEADING.finditer(text)]
    res = []
    for (a, b, table) in bl:
        if table or not text[a:b].lstrip().startswith(SECTION):
            continue
        before = [lv for (off, lv) in heads if off < a]
        level = before[-1] if before else 0
        end = min([off for (off, lv) in heads if off > a and lv <= level] or [len(text)])
        res.append((a, end, a, b))
    return res

errors = []
cache = {}
for path in sys.argv[1:]:
    raw = open(path, encoding="utf-8").read()
    text = blank_code(raw)
    line_of = lambda off: raw.count("\n", 0, off) + 1
    bl = blocks(text)
    secs = sections(text, bl)
    for i, (a, b, table) in enumerate(bl):
        cited_in = [(a, b)]
        if table and i > 0 and not bl[i - 1][2]:
            cited_in.append(bl[i - 1][:2])
        cited_in += [(pa, pb) for (sa, se, pa, pb) in secs if sa <= a < se and (pa, pb) != (a, b)]
        cites = [(x + m.start(), m) for (x, y) in cited_in for m in CITATION.finditer(raw[x:y])]
        scan = text[a:b]
        for m in CITATION.finditer(raw[a:b]):  # a citation's own numbers are not figures
            scan = scan[: m.start()] + " " * (m.end() - m.start()) + scan[m.end():]
        figures = list(FIGURE.finditer(scan))
        if not figures:
            continue
        if not cites:
            f = figures[0]
            errors.append("%s:%d: figure %r has no citation in its %s" % (
                path, line_of(a + f.start()), f.group(0), "table or the paragraph before it" if table else "paragraph"))
            continue
        files = []
        for off, c in cites:
            date, version, _client, rel = c.groups()
            where = "%s:%d" % (path, line_of(off))
            if rel not in cache:
                cache[rel] = open(rel, encoding="utf-8").read().replace(",", "") if os.path.isfile(rel) else None
            if cache[rel] is None:
                errors.append("%s: cited results file %s is missing" % (where, rel))
                continue
            for need in (date, version):
                if need not in cache[rel]:
                    errors.append("%s: cited results file %s does not name %s" % (where, rel, need))
            files.append(rel)
        if not files:
            continue
        for f in figures:
            for n in numbers(f.group(1)):
                if not any(holds(cache[r], n) for r in files):
                    errors.append("%s:%d: figure %r: %s is not in %s" % (
                        path, line_of(a + f.start()), f.group(0).strip(), n, " or ".join(files)))
for e in errors:
    print("check-figures: " + e, file=sys.stderr)
if errors:
    sys.exit(1)
print("check-figures: %s: every figure cites a results file that holds it" % ", ".join(sys.argv[1:]))
PY
