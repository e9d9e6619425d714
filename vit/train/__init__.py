"""Training: `optim` (parameter groups, optimizer, schedule), `engine` (the loop's pieces), `tasks` (one training
mode each: loss, evaluation, checkpoint choice, what is saved), `lifecycle` (a run's start and end around the loop),
`records` (metrics.csv, the best checkpoints), `indexer` (DSA's indexer stages by step), `state` (training states
saved complete or not at all, verified before a resume reads them), `runfolder` (one run folder per training: lock,
resume), `console` (what the main process prints), `tracking` (run.log_with: Accelerate's experiment trackers),
`preemption` (SIGTERM saves a state), `contrastive` (CLIP's and SigLIP's losses), `lora` (LoRA adapters), `few_shot`
(N labels per class), `distill` (knowledge distillation's losses), `teacher` (the frozen teacher in its own
preprocessing), `ssl_losses` (DINO, iBOT, KoLeo and their schedules), `knn_monitor` (a pretraining run's k-NN top-1
on a few labelled images). Import by module."""
