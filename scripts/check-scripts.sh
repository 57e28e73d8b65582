#!/usr/bin/env bash
# Checks the project's shell scripts (the test command's "scripts" step; seconds):
#
#   scripts/check-scripts.sh [FILE...]
#
# 1. No pipe into a reader that may stop reading early, in a script that sets pipefail:
#    `cmd | grep -q`, `| grep -m N`, `| grep -l`, `| head`, `| sed ...q`, `| awk ...exit`,
#    `| read`, `| true`, or a `| while` loop that breaks out. The reader quits, the writer is
#    killed by SIGPIPE (or, being a Rust program, fails on EPIPE), and under pipefail the
#    pipeline fails although the reader found what it looked for: the demo once took
#    `kubectl api-versions | grep -qx policy/v1` for a server without policy/v1. Read the
#    writer's output whole first (`out=$(cmd) || die ...`, then `grep -q ... <<<"$out"` or
#    `[[ $out == *...* ]]`), so that a real failure of the writer is still an error; or let a
#    filter read all of it (`grep ... >/dev/null`, `sed -n '...{p;q}' FILE` on a file).
#    Each finding is printed as FILE:LINE. A line may opt out with a comment holding
#    `check-scripts: allow` and the reason.
# 2. shellcheck (Debian's package: installed here when missing and root), at severity warning.
#    Its info and style levels are left out on purpose: all they flag in these scripts is
#    deliberate (SC2153: NODE_IP comes from a sourced file; SC2012: `ls -t` on file names the
#    scripts make; SC2015: `A && B || C` where C is meant for either failure; SC2016: single
#    quotes around a `$` that a later shell expands; SC2013: words of a file of PIDs; SC2323:
#    spare parentheses), and a check that fails on taste gets switched off. Warnings and errors
#    are bugs or close to them, and fail the check.
#
# Without FILE arguments: every shell script under scripts/, .ci/, e2e/, testenv/ and tools/ for 1,
# scripts/*.sh, scripts/images/*.sh and .ci/run for 2. Exits 1 naming what it found.
set -euo pipefail

if [ $# -gt 0 ]; then
  files=("$@")
  shellcheck_files=("$@")
else
  cd "$(dirname "$0")/.."
  files=()
  while IFS= read -r -d '' f; do
    case "$f" in
      *.sh) files+=("$f") ;;
      *) first_line=""
         IFS= read -r -n 200 first_line <"$f" 2>/dev/null || true
         if [[ $first_line =~ ^#!.*[/\ ](ba|da)?sh([[:space:]]|$) ]]; then files+=("$f"); fi ;;
    esac
  done < <(find scripts .ci e2e testenv tools \( -name target -o -name .git -o -name node_modules \) -prune \
             -o -type f -print0 | sort -z)
  # The list itself is checked: a find that failed must not pass as "nothing found".
  [[ " ${files[*]} " == *" scripts/test.sh "* ]] || { echo "check-scripts: scripts/test.sh not found" >&2; exit 1; }
  shellcheck_files=(scripts/*.sh scripts/images/*.sh .ci/run)
fi
[ ${#files[@]} -gt 0 ] || { echo "check-scripts: no shell scripts found" >&2; exit 1; }

status=0
echo "pipes into early-exiting readers under pipefail: ${#files[@]} scripts"
python3 - "${files[@]}" <<'PY' || status=1
"""A small shell lexer: enough of bash's grammar (quotes, $(...), `...`, <(...), $((...)),
[[ ... ]], here-documents, comments, case patterns) to find the commands that read a pipe."""
import os
import re
import sys

OPS = ["<<<", "<<-", ";;&", "&>>", "||", "|&", "&&", ";;", ";&", "<<", ">>", "<&", ">&", "<>",
       ">|", "&>", "|", "&", ";", "(", ")", "<", ">"]
REDIRS = {"<<<", "<<-", "<<", ">>", "<&", ">&", "<>", ">|", "&>", "&>>", "<", ">"}
PIPES = {"|", "|&"}
WRAPPERS = {"!", "command", "builtin", "exec", "time", "nice", "env", "stdbuf", "timeout", "nohup",
            "sudo", "ionice", "chrt", "setsid"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
PIPEFAIL = re.compile(r"^[ \t]*(set\b[^#\n]*-[A-Za-z]*o[ \t]+pipefail|shopt[ \t]+-[a-z]*o[a-z]*[ \t]+pipefail)",
                      re.M)


class Tok:
    __slots__ = ("kind", "text", "line")

    def __init__(self, kind, text, line):
        self.kind, self.text, self.line = kind, text, line


class Lexer:
    def __init__(self, src, line=1):
        self.s, self.i, self.line = src, 0, line
        self.subs = []      # token lists of $(...), `...`, <(...): command lists of their own
        self.pending = []   # here-documents whose bodies start after the current line

    def at(self, k=0):
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def skip_to_matching(self, opening, closing):
        """From self.i at `opening`, past its matching `closing` (nesting, newlines counted)."""
        depth = 0
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\":
                self.i += 1
            elif c == "\n":
                self.line += 1
            elif c == opening:
                depth += 1
            elif c == closing:
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return
            self.i += 1

    def braces(self):
        """self.i just past `${`: past its `}`, lexing any $(...) inside (${x:-$(cmd)})."""
        depth = 1
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\":
                self.i += 2
                continue
            if c == "$" and self.at(1) == "(" and self.at(2) != "(":
                self.i += 2
                self.sub()
                continue
            if c == "\n":
                self.line += 1
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return
            self.i += 1

    def sub(self):
        """self.i just past `$(`, `<(` or `>(`: lexes to the matching `)`."""
        self.subs.append(self.lex(closer=True))

    def backtick(self):
        start, line = self.i + 1, self.line
        self.i += 1
        while self.i < len(self.s) and self.s[self.i] != "`":
            if self.s[self.i] == "\\":
                self.i += 1
            elif self.s[self.i] == "\n":
                self.line += 1
            self.i += 1
        inner = Lexer(self.s[start:self.i].replace("\\`", "`"), line)
        self.subs.append(inner.lex())
        self.subs.extend(inner.subs)
        self.i += 1

    def dollar(self, add):
        """At `$`: command substitution, arithmetic, ${...}, $'...' or a plain `$`."""
        n = self.at(1)
        if n == "(" and self.at(2) == "(":
            self.i += 1
            self.skip_to_matching("(", ")")
            add("$((...))")
        elif n == "(":
            self.i += 2
            self.sub()
            add("$(...)")
        elif n == "{":
            self.i += 2
            self.braces()
            add("${...}")
        elif n == "'":
            self.i += 2
            text = []
            while self.i < len(self.s) and self.s[self.i] != "'":
                if self.s[self.i] == "\\":
                    text.append(self.s[self.i:self.i + 2])
                    self.i += 2
                    continue
                if self.s[self.i] == "\n":
                    self.line += 1
                text.append(self.s[self.i])
                self.i += 1
            self.i += 1
            add("".join(text))
        else:
            add("$")
            self.i += 1

    def dquote(self, add):
        self.i += 1
        add("")
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                return
            if c == "\\":
                add(self.at(1))
                if self.at(1) == "\n":
                    self.line += 1
                self.i += 2
            elif c == "$":
                self.dollar(add)
            elif c == "`":
                self.backtick()
                add("`...`")
            else:
                if c == "\n":
                    self.line += 1
                add(c)
                self.i += 1

    def heredoc_delimiter(self, strip_tabs):
        while self.at() in (" ", "\t"):
            self.i += 1
        word = []
        while self.i < len(self.s) and self.s[self.i] not in " \t\n;&|<>()":
            if self.s[self.i] not in "'\"\\":
                word.append(self.s[self.i])
            self.i += 1
        self.pending.append(("".join(word), strip_tabs))
        return "".join(word)

    def heredoc_bodies(self):
        for delimiter, strip_tabs in self.pending:
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                text = self.s[self.i:end]
                self.i = end + 1
                self.line += 1
                if (text.lstrip("\t") if strip_tabs else text) == delimiter:
                    break
        self.pending = []

    def lex(self, closer=False):
        """Tokens to the end, or (closer) to the `)` that closes the substitution."""
        toks, word, wline = [], [], [None]
        depth, cond = 0, [False]

        def add(text):
            if wline[0] is None:
                wline[0] = self.line
            word.append(text)

        def flush():
            if wline[0] is not None:
                w = "".join(word)
                toks.append(Tok("word", w, wline[0]))
                if w == "[[":
                    cond[0] = True
                elif w == "]]":
                    cond[0] = False
                word.clear()
                wline[0] = None

        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\":
                if self.at(1) == "\n":
                    self.line += 1
                else:
                    add(self.at(1))
                self.i += 2
            elif c == "\n":
                flush()
                toks.append(Tok("op", "nl", self.line))
                self.i += 1
                self.line += 1
                self.heredoc_bodies()
            elif c in " \t":
                flush()
                self.i += 1
            elif c == "#" and wline[0] is None:
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            elif c == "'":
                end = self.s.find("'", self.i + 1)
                end = len(self.s) if end < 0 else end
                text = self.s[self.i + 1:end]
                add(text)
                self.line += text.count("\n")
                self.i = end + 1
            elif c == '"':
                self.dquote(add)
            elif c == "`":
                self.backtick()
                add("`...`")
            elif c == "$":
                self.dollar(add)
            elif cond[0] and c in "|()<>&" and self.s[self.i:self.i + 2] not in ("||", "&&"):
                add(c)         # [[ ... ]]: a regex or a comparison, not a pipe
                self.i += 1
            elif c in "<>" and self.at(1) == "(":
                self.i += 2
                self.sub()
                add("<(...)")
            elif c == "(" and wline[0] is None and self.at(1) == "(":
                self.skip_to_matching("(", ")")   # (( arithmetic ))
                add("((...))")
                flush()
            elif c in "|&;()<>":
                if c in "<>" and word and "".join(word).isdigit():
                    word.clear()                   # 2>file: the fd number belongs to the redirection
                    wline[0] = None
                flush()
                op = next(o for o in OPS if self.s.startswith(o, self.i))
                if closer and op == "(":
                    depth += 1
                elif closer and op == ")":
                    if depth == 0:
                        self.i += 1
                        return toks
                    depth -= 1
                toks.append(Tok("op", op, self.line))
                self.i += len(op)
                if op in ("<<", "<<-"):
                    line = self.line
                    toks.append(Tok("word", self.heredoc_delimiter(op == "<<-"), line))
            else:
                add(c)
                self.i += 1
        flush()
        return toks


def grep_stops_early(args):
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--":
            break
        if a.startswith("--"):
            key = a[2:].split("=")[0]
            if key in ("quiet", "silent", "max-count", "files-with-matches", "files-without-match"):
                return a
            if key in ("regexp", "file", "after-context", "before-context", "context") and "=" not in a:
                i += 1
            continue
        if a.startswith("-") and len(a) > 1:
            for k, ch in enumerate(a[1:]):
                if ch in "qlLm":
                    return "-" + ch
                if ch in "efABCdD":
                    if k == len(a) - 2:
                        i += 1     # the option's argument is the next word
                    break
    return None


SED_QUIT = re.compile(r"(^|[;{}\n0-9$/])[ \t]*[qQ][ \t]*[0-9]*[ \t]*($|[;}\n#])")


def sed_quits(args):
    scripts, i, explicit = [], 0, False
    while i < len(args):
        a = args[i]
        i += 1
        if a in ("-e", "--expression") and i < len(args):
            scripts.append(args[i])
            explicit = True
            i += 1
        elif a.startswith("--expression="):
            scripts.append(a.split("=", 1)[1])
            explicit = True
        elif a.startswith("-e") and len(a) > 2:
            scripts.append(a[2:])
            explicit = True
        elif a in ("-f", "--file", "-l", "--line-length"):
            i += 1
        elif a.startswith("-") and len(a) > 1:
            continue
        elif not explicit:
            scripts.append(a)
            explicit = True
    return any(SED_QUIT.search(s) for s in scripts)


def reader_words(toks, i):
    """The words of the command starting at toks[i] (redirections left out)."""
    words = []
    while i < len(toks):
        t = toks[i]
        if t.kind == "op":
            if t.text in REDIRS:
                i += 2
                continue
            break
        words.append(t)
        i += 1
    return words


def strip_wrappers(words):
    while words:
        w = words[0].text
        if ASSIGNMENT.match(w):
            words = words[1:]
        elif w in WRAPPERS:
            words = words[1:]
            # the wrapper's options, and timeout's duration / nice's -n N
            while words and (words[0].text.startswith("-") or re.match(r"^[0-9.]+[smhd]?$", words[0].text)):
                words = words[1:]
        else:
            break
    return words


def loop_breaks(toks, i):
    depth = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "word":
            if t.text == "do":
                depth += 1
            elif t.text == "done":
                depth -= 1
                if depth == 0:
                    return False
            elif t.text in ("break", "exit", "return") and depth > 0:
                return True
        i += 1
    return False


def without_end(program):
    """An awk program less its END blocks (an exit there comes after all input was read)."""
    while True:
        m = re.search(r"\bEND[ \t\n]*\{", program)
        if not m:
            return program
        depth, j = 0, m.end() - 1
        while j < len(program):
            depth += {"{": 1, "}": -1}.get(program[j], 0)
            j += 1
            if depth == 0:
                break
        program = program[:m.start()] + program[j:]


def why(words, toks, start):
    if not words:
        return None
    name = os.path.basename(words[0].text)
    args = [w.text for w in words[1:]]
    if name in ("grep", "egrep", "fgrep", "zgrep", "rg"):
        flag = grep_stops_early(args)
        if flag:
            return f"{name} {flag} stops reading at its first match (or count)"
    elif name == "head":
        return "head stops reading after its lines"
    elif name == "sed" and sed_quits(args):
        return "sed's q command stops reading"
    elif name in ("awk", "gawk", "mawk", "nawk") and any(re.search(r"\bexit\b", without_end(a)) for a in args):
        return f"{name}'s exit stops reading"
    elif name == "read":
        return "read takes one line and leaves the rest unread"
    elif name in ("true", "false", ":", "exit", "cmp"):
        return f"{name} does not read (all of) its input"
    elif name in ("while", "until") and loop_breaks(toks, start):
        return f"the {name} loop can leave (break/exit/return) before its input ends"
    return None


def analyse(toks, path, lines, findings):
    case = []          # per open `case`: "head" (before `in`), "pat" (patterns), "body"
    at_cmd = True
    i = 0
    while i < len(toks):
        t = toks[i]
        state = case[-1] if case else None
        if state == "head":
            if t.kind == "word" and t.text == "in":
                case[-1] = "pat"
            i += 1
            continue
        if state == "pat":
            if t.kind == "word" and t.text == "esac":
                case.pop()
                at_cmd = False
            elif t.kind == "op" and t.text == ")":
                case[-1] = "body"
                at_cmd = True
            i += 1
            continue
        if t.kind == "op":
            if t.text in (";;", ";&", ";;&") and state == "body":
                case[-1] = "pat"
            elif t.text in REDIRS:
                i += 2
                continue
            elif t.text in PIPES:
                i += 1
                while i < len(toks) and toks[i].kind == "op" and toks[i].text == "nl":
                    i += 1
                words = strip_wrappers(reader_words(toks, i))
                reason = why(words, toks, i)
                if reason:
                    line = words[0].line
                    raw = " ".join(lines[n - 1] for n in {t.line, line} if 0 < n <= len(lines))
                    if "check-scripts: allow" not in raw:
                        shown = " ".join(w.text for w in words)
                        if len(shown) > 60:
                            shown = shown[:57] + "..."
                        findings.append(f"{path}:{line}: | {shown}: {reason}")
                at_cmd = True
                continue
            at_cmd = True
            i += 1
            continue
        if at_cmd:
            w = t.text
            if w == "case":
                case.append("head")
                at_cmd = False
            elif w == "esac" and state == "body":
                case.pop()
                at_cmd = False
            elif w in ("if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "time",
                       "fi", "done") or ASSIGNMENT.match(w):
                pass
            else:
                at_cmd = False
        i += 1


def check(path, text):
    if not PIPEFAIL.search(text):
        return []
    lexer = Lexer(text)
    lists = [lexer.lex()] + lexer.subs
    findings = []
    lines = text.split("\n")
    for toks in lists:
        analyse(toks, path, lines, findings)
    return sorted(set(findings), key=lambda f: int(f.split(":")[1]))


# What the check must find, and what it must let pass: it runs on these first, every time.
SELF_TEST = r"""set -euo pipefail
k api-versions | grep -qx policy/v1 || PDB_API=policy/v1beta1
x=$(cmd | head -n 1)
say "v $("$BIN" --version | head -n 1 | cut -d' ' -f2)"
cmd \
  | grep -m1 foo
cmd |
  sed -n '/x/{p;q}'
cmd | LC_ALL=C grep -Fq x
cmd | awk '/x/ { print; exit }'
cmd | while read -r l; do [ "$l" = x ] && break; done
cmd | grep --quiet x
ok=$(cmd) && grep -q x <<<"$ok"
cmd | grep x >/dev/null
cmd | sed -n 's/a/q/p' | tail -n 1
[[ $x =~ ^(a|b)$ ]] && echo "a | grep -q b"
case "$x" in a|head) echo one ;; b|grep) echo two ;; esac
echo 'x | head' # y | head
cat <<EOF
z | head -n 1
EOF
v=${x:-$(cmd | head -n 1)}
y=$(( 1 | 2 ))
cmd | while read -r l; do echo "$l"; done
cmd | grep -q x # check-scripts: allow (the test)
cmd | awk '{ n++ } END { if (n == 0) exit 1; print n }'
"""
SELF_TEST_LINES = [2, 3, 4, 6, 8, 9, 10, 11, 12, 22]

found = check("self-test", SELF_TEST)
got = [int(f.split(":")[1]) for f in found]
if got != SELF_TEST_LINES:
    print("check-scripts: the self-test found lines", got, "not", SELF_TEST_LINES, file=sys.stderr)
    for f in found:
        print("  ", f, file=sys.stderr)
    sys.exit(2)

findings, checked = [], 0
for path in sys.argv[1:]:
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if PIPEFAIL.search(text):
        checked += 1
    findings.extend(check(path, text))
for f in findings:
    print(f)
print(f"{checked} with pipefail checked, {len(findings)} found")
if findings:
    print("  under pipefail the writer's SIGPIPE, once the reader has quit, fails the pipeline:")
    print("  read the writer's output whole first (out=$(cmd) || die ...), then test \"$out\"")
sys.exit(1 if findings else 0)
PY

# The second check: ShellCheck, from Debian's packages when missing (as root: the test command's case).
if ! command -v shellcheck >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing shellcheck (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends shellcheck >/dev/null 2>&1 \
    || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends shellcheck >&2; } \
    || echo "check-scripts: apt-get install shellcheck failed" >&2
fi
if command -v shellcheck >/dev/null; then
  echo "shellcheck -S warning: ${#shellcheck_files[@]} scripts ($(shellcheck --version | sed -n 's/^version: //p'))"
  shellcheck -S warning "${shellcheck_files[@]}" || status=1
else
  echo "shellcheck: SKIPPED (not installed, and not root to install it: apt-get install shellcheck)"
fi

if [ "$status" != 0 ]; then
  echo "check-scripts: FAILED (see above)" >&2
  exit 1
fi
echo "check-scripts: passed"
