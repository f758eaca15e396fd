"""bertha: BERT-family encoders in Rust, from Python.

sentence-transformers' and transformers' call shapes over the bertha
library (the wheel holds it: no PyTorch), numpy arrays out::

    import bertha
    model = bertha.SentenceTransformer("all-MiniLM-L6-v2/")
    embeddings = model.encode(["first text", "second text"])

Model work releases the GIL: threads may call one model concurrently.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _bertha
from ._bertha import __version__
from ._pipelines import pipeline
from ._progress import bar as _bar

__all__ = [
    "SentenceTransformer",
    "CrossEncoder",
    "pipeline",
    "train",
    "similarity",
    "__version__",
]

PathLike = Union[str, "os.PathLike[str]"]


def _path(p: PathLike) -> str:
    return os.fspath(p)


def similarity(a: Any, b: Any, fn: str = "cosine") -> np.ndarray:
    """Scores between every row of ``a`` and every row of ``b`` (n, m), as
    sentence-transformers' similarity functions: ``cosine``, ``dot``,
    ``euclidean`` (negative distance) and ``manhattan`` (negative distance).
    """
    x = np.atleast_2d(np.asarray(a, dtype=np.float32))
    y = np.atleast_2d(np.asarray(b, dtype=np.float32))
    if fn == "cosine":
        # As torch's normalize: norms are clamped at 1e-12.
        xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        yn = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
        return xn @ yn.T
    if fn == "dot":
        return x @ y.T
    if fn == "euclidean":
        return -np.sqrt(np.maximum(((x[:, None, :] - y[None, :, :]) ** 2).sum(-1), 0.0))
    if fn == "manhattan":
        return -np.abs(x[:, None, :] - y[None, :, :]).sum(-1)
    raise ValueError(
        f"similarity_fn_name `{fn}` is not one of cosine, dot, euclidean, manhattan"
    )


class SentenceTransformer:
    """A sentence-embedding model from a local folder (a sentence-transformers
    folder, with its pooling, Normalize, prompts and max_seq_length; or a
    plain checkpoint: mean pooling).

    ``precision`` is the compute precision of the encoder: ``float32``
    (exact), ``int8`` (dynamic quantisation, approximate) or ``bf16``.
    """

    def __init__(
        self,
        model_name_or_path: PathLike,
        *,
        precision: str = "float32",
        truncate_dim: Optional[int] = None,
        similarity_fn_name: Optional[str] = None,
        max_seq_length: Optional[int] = None,
    ) -> None:
        self._model = _bertha.Embedder(
            _path(model_name_or_path), precision=precision, max_seq_length=max_seq_length
        )
        self.truncate_dim = truncate_dim
        self._similarity_fn_name = similarity_fn_name

    @property
    def max_seq_length(self) -> int:
        """Tokens per text; longer texts are truncated."""
        return self._model.max_seq_length

    @property
    def prompts(self) -> Dict[str, str]:
        return self._model.prompts

    @property
    def default_prompt_name(self) -> Optional[str]:
        return self._model.default_prompt_name

    @property
    def similarity_fn_name(self) -> str:
        """The folder's ``similarity_fn_name``, else ``cosine``."""
        return self._similarity_fn_name or self._model.similarity_fn_name or "cosine"

    @similarity_fn_name.setter
    def similarity_fn_name(self, name: str) -> None:
        self._similarity_fn_name = name

    def get_sentence_embedding_dimension(self) -> int:
        d = self._model.dimension
        return min(d, self.truncate_dim) if self.truncate_dim else d

    def encode(
        self,
        sentences: Union[str, Sequence[str]],
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
        convert_to_numpy: bool = True,
        normalize_embeddings: bool = False,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        truncate_dim: Optional[int] = None,
        precision: str = "float32",
    ) -> Union[np.ndarray, List[np.ndarray]]:
        """Embeds ``sentences``: a float32 array (n, dim), or (dim,) for one
        string, as sentence-transformers' ``encode``. ``convert_to_numpy=False``
        gives a list of 1-D arrays (sentence-transformers gives a list of
        tensors). ``truncate_dim`` keeps the first values without
        renormalising unless ``normalize_embeddings``, as sentence-transformers.
        """
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("sentences must be strings")
        if prompt is not None and prompt_name is not None:
            # sentence-transformers: a given prompt wins over prompt_name.
            prompt_name = None
        dim = truncate_dim if truncate_dim is not None else self.truncate_dim
        # The precision of the load serves calls that keep the default.
        asked = None if precision in ("float32", self._model.precision) else precision
        progress = _bar(len(texts), "Encoding") if show_progress_bar else None
        try:
            out = self._model.encode(
                texts,
                batch_size=batch_size,
                prompt_name=prompt_name,
                prompt=prompt,
                truncate_dim=dim,
                normalize=normalize_embeddings,
                precision=asked,
                progress=progress,
            )
        finally:
            if progress is not None:
                progress.close()
        if single:
            return out[0]
        if not convert_to_numpy:
            return list(out)
        return out

    def similarity(self, embeddings1: Any, embeddings2: Any) -> np.ndarray:
        """Scores (n, m) by the model's ``similarity_fn_name`` (default cosine)."""
        return similarity(embeddings1, embeddings2, self.similarity_fn_name)

    def __repr__(self) -> str:
        return f"bertha.SentenceTransformer({self._model.path!r})"



class CrossEncoder:
    """A cross-encoder (reranker): a sentence-transformers CrossEncoder folder,
    or any sequence-classification checkpoint; scores (text, text) pairs
    through the activation the folder names (sigmoid for one label).

    ``max_length`` caps the tokens of a pair; ``batch_size`` is the pairs per
    forward pass (fixed at load: the library batches pairs of similar length).
    """

    def __init__(
        self,
        model_name_or_path: PathLike,
        *,
        precision: str = "float32",
        max_length: Optional[int] = None,
        batch_size: int = 32,
    ) -> None:
        self._model = _bertha.CrossEncoder(
            _path(model_name_or_path),
            precision=precision,
            max_length=max_length,
            batch_size=batch_size,
        )

    @property
    def num_labels(self) -> int:
        return self._model.num_labels

    @property
    def max_length(self) -> int:
        return self._model.max_length

    def predict(
        self,
        sentences: Union[Tuple[str, str], Sequence[Tuple[str, str]]],
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
        activation_fn: Optional[str] = None,
        convert_to_numpy: bool = True,
    ) -> Union[np.ndarray, float, List[Any]]:
        """Scores of (text, text) pairs, as sentence-transformers' ``predict``:
        (n,) for a one-label model, else (n, labels); one pair gives its
        score. ``activation_fn``: ``sigmoid``, ``identity``, ``tanh``,
        ``softmax`` or a torch class path (default: the folder's).
        ``batch_size`` is the load's (see the class)."""
        single = (
            isinstance(sentences, (tuple, list))
            and len(sentences) == 2
            and all(isinstance(s, str) for s in sentences)
        )
        pairs = [sentences] if single else list(sentences)
        firsts = [p[0] for p in pairs]
        seconds = [p[1] for p in pairs]
        scores = self._model.predict(firsts, seconds, activation=activation_fn)
        if single:
            return scores[0]
        return scores if convert_to_numpy else list(scores)

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: Optional[int] = None,
        return_documents: bool = False,
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
    ) -> List[Dict[str, Any]]:
        """Documents by score for ``query``, best first: dicts with
        ``corpus_id`` and ``score`` (and ``text``), as sentence-transformers."""
        docs = list(documents)
        ranked = self._model.rank(query, docs, top_k=top_k)
        if return_documents:
            for r in ranked:
                r["text"] = docs[r["corpus_id"]]
        return ranked


def train(
    task: str,
    model: PathLike,
    train: PathLike,
    dev: Optional[PathLike] = None,
    out: PathLike = "finetuned",
    show_progress_bar: bool = True,
    **options: Any,
) -> Dict[str, Any]:
    """Fine-tunes ``model`` for ``task`` (``classification``, ``ner``, ``qa``,
    ``embedding`` for a sentence-transformers bi-encoder, ``rerank`` for a
    cross-encoder) on the ``train`` file, scoring ``dev``, writing the model,
    checkpoints and metrics to ``out``: the loop and options of ``bertha
    finetune``, by their field names (``epochs``, ``lr``, ``batch_size``,
    ``max_train``, ``eval_every``, ``seed``, ``engine``, ``precision``,
    ``resume``, ...; embedding and rerank: ``loss``, ``scale``, and rerank's
    ``pos_weight``), with its defaults. Returns the run's metrics: ``loss``
    (the last step's), ``steps`` (every step's figures), ``evals`` (every dev
    evaluation).
    """
    progress: Dict[str, Any] = {}

    def on_event(kind: str, data: Dict[str, Any]) -> None:
        if not show_progress_bar:
            return
        if kind == "start":
            progress["bar"] = _bar(data["total_steps"], "Training", initial=data["step"])
            progress["at"] = data["step"]
            return
        b = progress.get("bar")
        if b is None:
            return
        if kind == "step":
            b.update(data["step"] - progress["at"])
            progress["at"] = data["step"]
            b.set_postfix_str(f"epoch {data['epoch']:.2f} loss {data['loss']:.4f} lr {data['lr']:.2e}")
        elif kind == "eval":
            scores = ", ".join(
                f"{k} {v:.4f}" for k, v in data.items()
                if k not in ("step", "epoch", "eval_loss", "metric", "greater_is_better")
            )
            b.write(f"step {data['step']} (epoch {data['epoch']:.2f}): dev loss {data['eval_loss']:.4f}, {scores}")
        elif kind == "saved":
            b.write(f"saved {data['path']}")
        elif kind == "early_stop":
            b.write(f"early stop at step {data['step']}: no better dev score since step {data['best_step']}")

    try:
        return _bertha.train(
            task,
            _path(model),
            _path(train),
            _path(out),
            dev=_path(dev) if dev is not None else None,
            options=options,
            on_event=on_event,
        )
    finally:
        if "bar" in progress:
            progress["bar"].close()
