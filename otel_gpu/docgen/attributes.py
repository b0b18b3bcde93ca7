"""docs/attributes.md, generated from otel_gpu/semconv.py
(`python -m otel_gpu.docgen.attributes > docs/attributes.md`)."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from .. import semconv

def markdown() -> str:
    """docs/attributes.md: every name above, in file order. A blank line starts a section:
    its first comment is the section's text, a later comment block is the note of the name
    that follows it, and a trailing comment is its name's note."""
    source = Path(semconv.__file__).read_text()
    tree = ast.parse(source)
    names = {node.lineno: (node.targets[0].id, node.value.value) for node in tree.body
             if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
             and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    comments = {tok.start[0]: (tok.start[1], tok.string.lstrip("#").strip())
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    out = ["# Span and metric attributes", "",
           "Every attribute name otel-gpu exports, on spans, resources, links and metrics. Standard",
           "names follow the OpenTelemetry semantic conventions; otel-gpu's own live under `gpu.` and",
           "`otel_gpu.`. Generated from `otel_gpu/semconv.py` (`python -m otel_gpu.docgen.attributes >",
           "docs/attributes.md`; `tests/unit/test_docs.py` fails when this page and the code differ;",
           "`tests/unit/test_semconv.py` pins every name). Which span carries what:",
           "[spans and metrics](spans-and-metrics.md)."]
    heading: list[str] = []
    note: list[str] = []
    in_section = in_table = False
    lines = source.splitlines()
    for lineno in range(tree.body[0].end_lineno + 1, len(lines) + 1):
        if not lines[lineno - 1].strip():
            heading, note, in_section, in_table = [], [], False, False
        elif lineno in names:
            if not in_table:
                text = " ".join(heading)
                title = re.split(r" \(|: |\.$", text, maxsplit=1)[0] if text else "Other names"
                out += ["", f"## {title}", "", *([text, ""] if text != title else []),
                        "| attribute | constant | note |", "|---|---|---|"]
                in_section = in_table = True
            const, value = names[lineno]
            said = " ".join(note + ([comments[lineno][1]] if lineno in comments else []))
            out.append(f"| `{value}` | `{const}` | {said.replace('|', '/')} |")
            note = []
        elif lineno in comments and comments[lineno][0] == 0:
            (note if in_section else heading).append(comments[lineno][1])
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
