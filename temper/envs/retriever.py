"""A local retriever for the search tool: a BM25 index over a jsonl corpus, served over HTTP.

ROLL's ``HotpotQA_with_search`` points its search tool at ``search_url`` (GEM's dense
retrieval server on a Wikipedia index); any server speaking the same protocol works:

- ``POST <url>`` with a msgpack body ``{"query": str, "topk": int, "return_scores": bool}``
  (or the same as JSON, with ``Content-Type: application/json``: what the search tool
  sends when the ``msgpack`` package, which ray brings, is not installed);
- the answer, in the request's encoding: ``{"result": [{"document": {"contents":
  "<title>\\n<text>"}, "score": float | None}, …]}``, best first.

This module is such a server for a small corpus (a jsonl file of ``{"contents": …}``
rows, or ``{"title", "text"}`` rows), which is what the tests and a laptop run use:
``python -m temper.envs.retriever corpus.jsonl --port 8000`` serves
``http://127.0.0.1:8000/retrieve``.

Scoring is Okapi BM25 (:func:`bm25_scores`) over lower-cased alphanumeric tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import threading
from collections import Counter
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["BM25Index", "bm25_scores", "load_corpus", "serve", "tokenize"]

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased runs of letters and digits."""
    return _TOKEN.findall(text.lower())


def bm25_scores(
    query: Sequence[str],
    docs: Sequence[Sequence[str]],
    k1: float = 1.5,
    b: float = 0.75,
) -> list[float]:
    """Okapi BM25 of every tokenized doc for the query's tokens:

    ``score(D) = Σ_{q ∈ query} idf(q) · f(q,D)·(k1+1) / (f(q,D) + k1·(1 − b + b·|D|/avgdl))``
    with ``idf(q) = ln(1 + (N − n(q) + 0.5) / (n(q) + 0.5))``, ``f(q,D)`` the count of ``q``
    in ``D``, ``n(q)`` the number of docs holding ``q``, ``N`` the number of docs and
    ``avgdl`` their mean length (a query token repeated counts again).
    """
    n = len(docs)
    if n == 0:
        return []
    avgdl = sum(len(d) for d in docs) / n or 1.0
    counts = [Counter(d) for d in docs]
    df = Counter(t for c in counts for t in c)
    out = []
    for doc, c in zip(docs, counts):
        norm = k1 * (1.0 - b + b * len(doc) / avgdl)
        score = 0.0
        for q in query:
            f = c.get(q, 0)
            if f:
                idf = math.log(1.0 + (n - df[q] + 0.5) / (df[q] + 0.5))
                score += idf * f * (k1 + 1.0) / (f + norm)
        out.append(score)
    return out


def load_corpus(path: str | Path) -> list[str]:
    """The ``contents`` of each jsonl row (``title + "\\n" + text`` for rows without it)."""
    docs = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "contents" in row:
            docs.append(str(row["contents"]))
        else:
            docs.append(f"{row.get('title', '')}\n{row.get('text', '')}")
    return docs


class BM25Index:
    """A corpus and its tokens; :meth:`search` ranks it for a query."""

    def __init__(self, docs: Sequence[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.docs = list(docs)
        self.tokens = [tokenize(d) for d in self.docs]
        self.k1, self.b = k1, b

    def search(self, query: str, topk: int = 3) -> list[tuple[str, float]]:
        """The ``topk`` best docs with their scores (ties: corpus order), docs scoring 0 left out."""
        scores = bm25_scores(tokenize(query), self.tokens, self.k1, self.b)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [(self.docs[i], scores[i]) for i in order[: max(topk, 0)] if scores[i] > 0]

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The protocol's response to one request (module docstring)."""
        hits = self.search(str(request.get("query", "")), int(request.get("topk") or 3))
        scores = bool(request.get("return_scores"))
        return {
            "result": [
                {"document": {"contents": doc}, "score": score if scores else None}
                for doc, score in hits
            ]
        }


def _msgpack() -> Any:
    """msgpack (GEM's wire format; installed with ray), imported when a request uses it."""
    import msgpack

    return msgpack


def _handler(index: BM25Index) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            as_json = "json" in (self.headers.get("Content-Type") or "")
            try:
                request = json.loads(body) if as_json else _msgpack().unpackb(body)
                payload = index.answer(request)
            except Exception as err:  # a bad request is the client's problem, not a crash
                self.send_error(400, str(err))
                return
            data = json.dumps(payload).encode() if as_json else _msgpack().packb(payload)
            self.send_response(200)
            self.send_header(
                "Content-Type", "application/json" if as_json else "application/msgpack"
            )
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per query would flood a training log

    return Handler


def serve(
    index: BM25Index, host: str = "127.0.0.1", port: int = 0
) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``index`` on a daemon thread; returns the server (``shutdown()`` stops it) and
    its ``http://host:port/retrieve`` URL (``port=0``: a free port)."""
    server = ThreadingHTTPServer((host, port), _handler(index))
    threading.Thread(target=server.serve_forever, name="bm25-retriever", daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}/retrieve"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m temper.envs.retriever CORPUS.jsonl [--host H] [--port P]``."""
    parser = argparse.ArgumentParser(description="Serve a BM25 index over a jsonl corpus.")
    parser.add_argument("corpus")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    server, url = serve(BM25Index(load_corpus(args.corpus)), args.host, args.port)
    print(f"serving {args.corpus} at {url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
