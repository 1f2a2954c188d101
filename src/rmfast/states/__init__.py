"""Hidden states of scanned candidates on disk: the ``rmfast-states/1`` folder format, one package.

- :mod:`rmfast.states.format`: the folder's format (manifest, shards), its constants, the manifest's checks;
- :mod:`rmfast.states.names`: the states' names (``0``, ``k``, ``last_prenorm``, ``last_normed``, ``all``);
- :mod:`rmfast.states.reader`: :func:`open_states`, a :class:`StatesSet` that gathers any rows;
- :mod:`rmfast.states.writer`: :func:`write_states` from arrays, the scan's streaming :class:`StatesWriter`, a
  torchrun scan's :class:`StatesMerge`;
- :mod:`rmfast.states.shard`: a shard's bytes written from its batches' pieces, non-finite values counted;
- :mod:`rmfast.states.tie`: which scan a folder belongs to.

The names below are the package's API (``from rmfast.states import open_states``).

Example:
    >>> import tempfile; from pathlib import Path; import numpy as np
    >>> d = Path(tempfile.mkdtemp()) / "s.states"
    >>> x = np.arange(12, dtype="float32").reshape(4, 3)                 # (n=4, d=3)
    >>> _ = write_states(d, np.array([5, 6, 7, 8]), {"last_prenorm": x}, shard_rows=3)
    >>> s = open_states(d)
    >>> s.n, s.layers, s.hidden_size, [sh.rows for sh in s.shards]
    (4, ['last_prenorm'], 3, [3, 1])
    >>> s.take("last_prenorm", np.array([3, 0])).tolist()                 # rows 3 and 0
    [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0]]
"""

from .format import DTYPES, FORMAT, KEYS, MANIFEST, is_states_folder
from .names import LAST, LAST_NORMED, LAST_PRENORM, OLD_LAST, ByLayer, canonical_layer, layer_index, parse_layers
from .reader import Shard, StatesSet, open_states
from .shard import count_nonfinite, nonfinite_per_layer, warn_nonfinite, write_shard
from .writer import (KEEP_FRESH_MAX, SHARD_BYTES, StatesMerge, StatesWriter, check_states_target, partial_folder,
                     write_states)

__all__ = ["DTYPES", "FORMAT", "KEYS", "MANIFEST", "is_states_folder", "LAST", "LAST_NORMED", "LAST_PRENORM",
           "OLD_LAST", "ByLayer", "canonical_layer", "layer_index", "parse_layers", "Shard", "StatesSet", "open_states",
           "count_nonfinite", "nonfinite_per_layer", "warn_nonfinite", "write_shard", "KEEP_FRESH_MAX", "SHARD_BYTES",
           "StatesMerge", "StatesWriter", "check_states_target", "partial_folder", "write_states"]
