"""The C++ in native/ keeps the house style without anyone counting: clang-format's layout (the
repository's .clang-format) and no function longer than MAX_BODY_LINES.

The length check is a brace scan, exact for this code base: comments, string and character
literals are blanked out, then every ``{`` at namespace or class scope opens either a scope
(namespace, class, struct, union, enum), an initializer (a ``=`` or no parameter list before it)
or a function body (a parameter list before it; a constructor's braced member initializers are
skipped). A body's length is the number of lines between its braces; lambdas count toward the
function they are written in."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "native").glob("*.[ch]pp"))
MAX_BODY_LINES = 60
CLANG_FORMAT_MAJOR = 14  # the version .ci/run installs (Debian 12)


def test_native_sources_are_clang_formatted():
    clang_format = shutil.which("clang-format")
    if clang_format is None:
        pytest.skip("clang-format is not installed (.ci/run installs Debian's clang-format)")
    version = subprocess.run([clang_format, "--version"], capture_output=True, text=True).stdout
    major = re.search(r"version (\d+)", version)
    if major is None or int(major.group(1)) != CLANG_FORMAT_MAJOR:
        pytest.skip(f"{version.strip()}: the layout is clang-format {CLANG_FORMAT_MAJOR}'s "
                    "(Debian 12's); other versions break some lines differently")
    run = subprocess.run([clang_format, "--dry-run", "--Werror", *map(str, SOURCES)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, "clang-format -i native/*.cpp native/*.hpp fixes:\n" + run.stderr[-4000:]


def _blank_comments_and_literals(text: str) -> str:
    """`text` with comments, string and character literals and preprocessor lines replaced by
    spaces (newlines kept, so offsets and line numbers stay)."""
    out = list(text)
    i, n = 0, len(text)

    def blank(start: int, end: int) -> None:
        for j in range(start, end):
            if out[j] != "\n":
                out[j] = " "

    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and text[i:].lstrip(" \t").startswith("#"):
            end = text.find("\n", i)
            end = n if end < 0 else end
            while text[end - 1] == "\\":  # a continued macro line
                end = text.find("\n", end + 1)
                end = n if end < 0 else end
            blank(i, end)
            i = end
            continue
        at_line_start = c == "\n"
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.index("*/", i) + 2
        elif c in "\"'":
            end = i + 1
            while text[end] != c:
                end += 2 if text[end] == "\\" else 1
            end += 1
        else:
            i += 1
            continue
        blank(i, end)
        i = end
    return "".join(out)


_SCOPE = re.compile(r"^(template\s*<.*>\s*)?(namespace|class|struct|union|enum)\b")
_OPERATOR = re.compile(r"\boperator\s*[^\s(]+")


def _matching_brace(code: str, i: int) -> int:
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced brace at offset {i}")


def _function_bodies(code: str, start: int = 0, end: int | None = None):
    """(header, open offset, close offset) of each function body between `start` and `end` at
    namespace or class scope, nested scopes included."""
    end = len(code) if end is None else end
    header_start, i = start, start
    while i < end:
        c = code[i]
        if c in ";}":
            header_start = i + 1
        elif c == "{":
            header = " ".join(code[header_start:i].split())
            close = _matching_brace(code, i)
            signature = _OPERATOR.sub("operator", header)
            if _SCOPE.match(header):
                if not header.startswith("enum") and not re.match(r"^template.*\benum\b", header):
                    yield from _function_bodies(code, i + 1, close)
            elif "(" in signature and "=" not in signature.split("(")[0]:
                if re.search(r"\)[^(]*:[^:]", signature) and re.search(r"\w$", signature):
                    i = close + 1  # a constructor's braced member initializer: the body follows
                    continue
                yield header, i, close
            i, header_start = close + 1, close + 1
            continue
        i += 1


def long_functions(path: Path, limit: int = MAX_BODY_LINES) -> list[str]:
    """'file:line name (n lines)' for each function in `path` whose body has over `limit` lines."""
    text = path.read_text()
    code = _blank_comments_and_literals(text)
    found = []
    for header, opened, closed in _function_bodies(code):
        first, last = code.count("\n", 0, opened) + 1, code.count("\n", 0, closed) + 1
        lines = max(0, last - first - 1)
        if lines > limit:
            name = header.split("(")[0].split()[-1] if header.split("(")[0].split() else header
            found.append(f"{path.name}:{first} {name} ({lines} lines)")
    return found


def test_no_native_function_is_over_60_lines():
    over = [entry for path in SOURCES for entry in long_functions(path)]
    assert not over, f"functions over {MAX_BODY_LINES} lines (split them along their seams):\n" + \
        "\n".join(over)


def test_length_check_finds_functions_and_skips_the_rest(tmp_path):
    """The scan on a sample of the constructs native/ uses: only the two long functions count."""
    body = "\n".join(f"    x += {i};" for i in range(61))
    sample = tmp_path / "sample.cpp"
    sample.write_text(
        "#include <x>\n#define LOOP(x) \\\n  { x }\nnamespace a {\nnamespace {\n"
        "constexpr int kTable[3] = {1, 2, 3};\n"
        "struct S {\n    S(int v) : v_{v}, w_(v) {}\n    int v_, w_;\n"
        "    bool operator==(const S& o) const { return v_ == o.v_; }\n"
        f"    void long_member() {{\n{body}\n    }}\n}};\n"
        "enum class E { A, B };\n}  // namespace\n"
        f"void long_free(int x) {{  // a {{ in a comment\n    const char* s = \"}}\";\n{body}\n}}\n"
        "void short_one() {\n    auto f = [](int y) { return y; };\n}\n}  // namespace a\n")
    assert [e.split(" (")[0] for e in long_functions(sample)] == \
        ["sample.cpp:11 long_member", "sample.cpp:77 long_free"]
