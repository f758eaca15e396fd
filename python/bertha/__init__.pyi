import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

from ._pipelines import pipeline as pipeline

__version__: str

_Path = Union[str, os.PathLike[str]]
_F32 = npt.NDArray[np.float32]

def similarity(a: Any, b: Any, fn: str = "cosine") -> _F32: ...

class SentenceTransformer:
    truncate_dim: Optional[int]
    def __init__(
        self,
        model_name_or_path: _Path,
        *,
        precision: str = "float32",
        truncate_dim: Optional[int] = None,
        similarity_fn_name: Optional[str] = None,
        max_seq_length: Optional[int] = None,
    ) -> None: ...
    @property
    def max_seq_length(self) -> int: ...
    @property
    def prompts(self) -> Dict[str, str]: ...
    @property
    def default_prompt_name(self) -> Optional[str]: ...
    @property
    def similarity_fn_name(self) -> str: ...
    @similarity_fn_name.setter
    def similarity_fn_name(self, name: str) -> None: ...
    def get_sentence_embedding_dimension(self) -> int: ...
    @overload
    def encode(
        self,
        sentences: str,
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
        convert_to_numpy: bool = True,
        normalize_embeddings: bool = False,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        truncate_dim: Optional[int] = None,
        precision: str = "float32",
    ) -> _F32: ...
    @overload
    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
        convert_to_numpy: bool = True,
        normalize_embeddings: bool = False,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        truncate_dim: Optional[int] = None,
        precision: str = "float32",
    ) -> Union[_F32, List[_F32]]: ...
    def similarity(self, embeddings1: Any, embeddings2: Any) -> _F32: ...

class CrossEncoder:
    def __init__(
        self,
        model_name_or_path: _Path,
        *,
        precision: str = "float32",
        max_length: Optional[int] = None,
        batch_size: int = 32,
    ) -> None: ...
    @property
    def num_labels(self) -> int: ...
    @property
    def max_length(self) -> int: ...
    def predict(
        self,
        sentences: Union[Tuple[str, str], Sequence[Tuple[str, str]]],
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
        activation_fn: Optional[str] = None,
        convert_to_numpy: bool = True,
    ) -> Union[_F32, float, List[Any]]: ...
    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: Optional[int] = None,
        return_documents: bool = False,
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
    ) -> List[Dict[str, Any]]: ...

def train(
    task: str,
    model: _Path,
    train: _Path,
    dev: Optional[_Path] = None,
    out: _Path = "finetuned",
    show_progress_bar: bool = True,
    **options: Any,
) -> Dict[str, Any]: ...
