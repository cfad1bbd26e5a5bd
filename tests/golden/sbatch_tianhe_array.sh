#!/bin/bash

# Parameters
#SBATCH --array=0-2%3
#SBATCH --cpus-per-task=4
#SBATCH --job-name=dtbench-demo
#SBATCH --mem=16384M
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --open-mode=append
#SBATCH --output=/shared/results/demo/slurm/20260101T000000-abcdef/%A_%a_0_log.out
#SBATCH --partition=th_mt1
#SBATCH --signal=USR2@120
#SBATCH --time=720
#SBATCH --wckey=submitit

# setup
module load anaconda3/2021.05
source activate dtbench
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK

# command
export SUBMITIT_EXECUTOR=slurm
yhrun --unbuffered --output /shared/results/demo/slurm/20260101T000000-abcdef/%A_%a_%t_log.out python3 -u -m submitit.core._submit /shared/results/demo/slurm/20260101T000000-abcdef
