"""Auto-tuning: annotations, the evolutionary annotation tuner, the task scheduler, runners,
the results database and the training-set export (see docs/tuning.md).

The μGraph structure the generator finds is the sketch; grid dims, loop range, threads and
pipeline stages are its annotations. Every part sits behind a small interface with a test
double: cost models (``mirage_py.cost_model.create``: analytic, random), runners (model, gpu,
fake), tasks (anything with ``step``/``best_cost``/``done``/``weight``).
"""

from .annotations import MAX_STAGES, THREAD_CHOICES, AnnotatedGraph, Schedule, threads_of, \
    with_threads
from .database import TuningRecord, ResultsDB, default_path, open_database
from .export import export_training_set, graph_features
from .runners import FakeRunner, GpuRunner, Measurement, ModelRunner, default_runner, gpu_present
from .scheduler import ScheduleLog, TaskScheduler
from .stats import kendall_tau
from .tuner import Replayer, Tuner, TuneTask, make_task, replay_schedule

__all__ = ["MAX_STAGES", "THREAD_CHOICES", "AnnotatedGraph", "Schedule", "threads_of",
           "with_threads", "TuningRecord", "ResultsDB", "default_path", "open_database",
           "export_training_set", "graph_features", "FakeRunner", "GpuRunner", "Measurement",
           "ModelRunner", "default_runner", "gpu_present", "ScheduleLog", "TaskScheduler",
           "kendall_tau", "Replayer", "Tuner", "TuneTask", "make_task", "replay_schedule"]
