"""Training: `optim` (parameter groups, optimizer, schedule), `engine` (the loop's pieces), `records`
(metrics.csv, the best checkpoints), `indexer` (DSA's indexer stages by step), `state` (training states saved
complete or not at all, verified before a resume reads them), `runfolder` (one run folder per training: lock,
resume), `console` (what the main process prints), `tracking` (run.log_with: Accelerate's experiment trackers).
Import by module."""
