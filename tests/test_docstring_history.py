"""tokenrails' docstrings and comments say why, not when: history lives in CHANGELOG.md and git."""
import io
import re
import tokenize
from pathlib import Path

HISTORY = re.compile(r"\b[Ii]ssue #?\d+|\bPR #?\d+|(?<![\w&/])#\d{2,}\b|\bon main\b(?![ _-]?(?:thread|process|loop))")


def test_no_issue_numbers_in_docstrings_or_comments():
    found = [f"{path}:{tok.start[0]}: {HISTORY.search(tok.string)[0]}"
             for path in sorted((Path(__file__).resolve().parents[1] / "tokenrails").rglob("*.py"))
             for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
             if tok.type in (tokenize.COMMENT, tokenize.STRING) and HISTORY.search(tok.string)]
    assert not found, "history belongs in CHANGELOG.md, not in the code:\n" + "\n".join(found)
