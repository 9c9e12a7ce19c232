"""A run's lifecycle, from start-up to the last save: the folder it writes, the checkpoint it starts from,
the saves it keeps and the signals that end it.

- ``folder``: the run folder is writable and holds no other run before anything is written there, and a
  program claims it (a lock, then Hydra's record of the job) for as long as it runs;
- ``resume``: which checkpoint ``ckpt_path`` names, resolved once before any model loads; SLURM's USR2
  (requeue) goes to submitit's handler, the loggers writing out first;
- ``checkpoint_fit``: a checkpoint to resume fits the run (its model, its iterations left);
- ``checkpoint``: ``LastCheckpoint`` saves ``last.ckpt`` atomically, keeps the save before it, stops in one
  line on a full disk, and turns SIGTERM into a save at the end of the iteration in progress.

Their writes go through ``ragen2.outputs``, the guard every program's writes share (beside the destination,
renamed into place once whole).

The programs (``ragen2.train``, ``ragen2.eval``, …) stay at the package root and call into here.
"""
