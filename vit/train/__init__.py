"""Training: `optim` (parameter groups, optimizer, schedule), `engine` (the loop's pieces), `runfolder` (one run
folder per training: lock, resume), `console` (what the main process prints). Import by module."""
