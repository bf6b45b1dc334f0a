"""Pseudo-queries made from the documents' own text: one per document, no labels.

Real training queries cite a few popular documents; a map trained on them learns where those
documents lie. A pseudo-query per document (its title, or its first sentence) is a training
signal that privileges no document, so it can teach retrieval rather than popularity.

A pseudo-query's only positive is its own document. Its id is ``PSEUDO_PREFIX + doc_id`` so it
can never collide with a real query id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from embedtune.data.beir import document_text

__all__ = ["PSEUDO_QUERY_SOURCES", "PSEUDO_PREFIX", "pseudo_query_texts"]

#: ``title``: the document's title, or its first sentence where the title is empty or shared by
#: another document (ArguAna's debate titles are); ``first-sentence``: always the first sentence;
#: ``first-words``: the text's first 12 words, for a corpus with neither titles nor sentence ends
#: (NPL's texts are lower-cased with the punctuation removed, so their first sentence is the whole text).
PSEUDO_QUERY_SOURCES = ("title", "first-sentence", "first-words")
PSEUDO_PREFIX = "pseudo:"
# A sentence ends at ., ! or ? followed by white space; a text with none is one sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Shorter texts carry too little to retrieve by; they are skipped, not padded.
_MIN_CHARS = 12
# first-words: about a query's length (NPL's queries: 11 words median, its documents 37). A document of
# fewer than twice as many words gets none, so a pseudo-query is at most half of its document.
_FIRST_WORDS = 12


def _first_sentence(text: str) -> str:
    return _SENTENCE_END.split(text.strip(), maxsplit=1)[0].strip()


def pseudo_query_texts(corpus: Mapping[str, Mapping[str, str]], doc_ids: Sequence[str],
                       source: str = "title", skip_whole_documents: bool = False) -> tuple[list[str], list[str], list[str]]:
    """``(pseudo-query ids, their documents' ids, texts)`` for ``doc_ids`` of ``corpus``, in ``doc_ids`` order.

    Documents whose pseudo-query text would be shorter than 12 characters get none. With
    ``skip_whole_documents``, neither do documents whose pseudo-query would be their whole text
    as encoded (a title-only document, or a text without a sentence end and no title): such a
    pseudo-query is the document itself, which every map retrieves first, so scoring it says
    nothing about retrieval.

    Raises:
        ValueError: ``source`` is not one of :data:`PSEUDO_QUERY_SOURCES`.
    """
    if source not in PSEUDO_QUERY_SOURCES:
        raise ValueError(f"pseudo-queries: source must be one of {list(PSEUDO_QUERY_SOURCES)}; got {source!r}.")
    title_count: dict[str, int] = {}
    for doc_id in doc_ids:
        title = (corpus[doc_id].get("title") or "").strip()
        title_count[title] = title_count.get(title, 0) + 1
    ids: list[str] = []
    docs: list[str] = []
    texts: list[str] = []
    for doc_id in doc_ids:
        fields = corpus[doc_id]
        title = (fields.get("title") or "").strip()
        if source == "title" and title and title_count[title] == 1:
            text = title
        elif source == "first-words":
            words = (fields.get("text") or "").split()
            text = " ".join(words[:_FIRST_WORDS]) if len(words) >= 2 * _FIRST_WORDS else ""
        else:
            text = _first_sentence(fields.get("text") or "")
        if len(text) < _MIN_CHARS or (skip_whole_documents and text == document_text(fields)):
            continue
        ids.append(PSEUDO_PREFIX + doc_id)
        docs.append(doc_id)
        texts.append(text)
    return ids, docs, texts
