"""Write the example's real text set and tokenizer (offline, seconds):

    python examples/text/prepare.py            # -> examples/text/data/{corpus.csv,tokenizer/}

The text is scikit-learn's bundled dataset descriptions, cut into 8-word snippets labelled by the
dataset they describe (6 classes, 252 snippets). The tokenizer is a 1000-token WordPiece trained on them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from edgedeploy.train.text import build_wordpiece_tokenizer, sklearn_descr_corpus, write_csv


def main(out: Path) -> None:
    rows = sklearn_descr_corpus(words_per_sample=8)
    write_csv(rows, out / "corpus.csv")
    build_wordpiece_tokenizer([text for text, _ in rows], out / "tokenizer", vocab_size=1000)
    print(f"{len(rows)} snippets -> {out / 'corpus.csv'}, tokenizer -> {out / 'tokenizer'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "data")
