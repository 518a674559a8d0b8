"""Cost models checked against and learned from measurements (docs/learned.md).

Records (:mod:`.records`: a program's kernels, the GPU, the measured time, from KernelBench's
published timings or our own results database), the analytic model's calibration on them
(:mod:`.calibrate`), scores (:mod:`.metrics`), and two learned models trained by one pipeline
(:mod:`.model`): gradient-boosted trees on per-kernel features (:mod:`.gbt`, LightGBM) and a
GraphSAGE network over the operator graph with a pairwise ranking loss (:mod:`.gnn`).
``pip install 'mirage_py[learned]'`` brings LightGBM.
"""

from .calibrate import calibrate, predict_us
from .metrics import Score, TopK, median_log_error, score, top_k
from .model import LearnedCostModel, ModelKind, graph_record, load_model, train
from .records import (SPLIT_SEED, KernelNode, Record, Split, family_of, from_export_row,
                      load_records, save_records, split_of)

__all__ = ["calibrate", "predict_us", "Score", "TopK", "median_log_error", "score", "top_k",
           "LearnedCostModel", "ModelKind", "graph_record", "load_model", "train",
           "SPLIT_SEED", "KernelNode", "Record", "Split", "family_of", "from_export_row",
           "load_records", "save_records", "split_of"]
