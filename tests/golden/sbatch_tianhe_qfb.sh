#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=12
#SBATCH --job-name=dtbench-qfb-tianhe
#SBATCH --mem=49152M
#SBATCH --nodes=1
#SBATCH --ntasks-per-socket=1
#SBATCH --ntasks-per-node=2
#SBATCH --open-mode=append
#SBATCH --output=/shared/results/qfb-tianhe/slurm/20260101T000000-abcdef/%j_0_log.out
#SBATCH --partition=th_mt1
#SBATCH --signal=USR2@120
#SBATCH --time=720
#SBATCH --wckey=submitit

# setup
module load anaconda3/2021.05
source activate dtbench
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
export OMP_PROC_BIND=false

# command
export SUBMITIT_EXECUTOR=slurm
yhrun --unbuffered --output /shared/results/qfb-tianhe/slurm/20260101T000000-abcdef/%j_%t_log.out python3 -u -m submitit.core._submit /shared/results/qfb-tianhe/slurm/20260101T000000-abcdef
