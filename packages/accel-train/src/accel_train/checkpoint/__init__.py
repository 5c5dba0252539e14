"""The checkpoint package: how each file of a checkpoint is written and read, and what may be loaded.

``integrity``: a damaged file (cut short, garbled) is found before anything is loaded and reported as
`CorruptCheckpointError`, told apart from a crafted one. ``numbering``: which
``checkpoint_<n>`` an automatic save writes, and when it must stop instead. ``layout``: which backend
reads which folder of a checkpoint (by its name), and the files a DeepSpeed engine folder's loaders
open. ``file_io``: how each file of a checkpoint is written and read (``CheckpointIO``), never unpickling
code. ``safety``: what a pickle in a checkpoint may name (allow-lists, the DCP reader that applies them).
``folder_lock``: one writer at a time per folder. ``outcome``: every process of a save raises the same
error. ``manifest``: the fields of ``accel_checkpoint.json``, read without torch; ``run_record``: what the
run that saves is, as the manifest records it; ``resume_diff``: what a resuming run changed;
``portability``: on which process counts and backends a folder loads; ``inspection``: the report of
``accel checkpoint inspect``. ``staging``: an asynchronous save's copy of the state, taken at the call.
``background``: the thread that writes it, and `AsyncCheckpointError`. ``names``, ``folder``, ``checks``,
``walk``: file names, the folder's life, the checks before a load, the walk over the objects.
``megatron_io``, ``deepspeed_io``, ``deepspeed_universal``, ``deepspeed_merge``, ``merge``: the backends'
own formats. The documented module functions stay in ``accel_train.checkpointing`` at the package
root.
"""
