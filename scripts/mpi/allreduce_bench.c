/* MPI_Allreduce of fp32 sums, timed as OSU's osu_allreduce does (warm-up
 * rounds, then the mean time of the timed rounds over the processes), for
 * the sizes bertha's gradient all-reduce is measured at:
 * the MPI library's own figure to set beside bertha's bucketed reduction
 * (scripts/bench-allreduce.sh builds and runs both).
 *
 *   mpicc -O2 allreduce_bench.c -o allreduce_bench && mpiexec -np 2 ./allreduce_bench
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const long max_bytes = 64L << 20;
    float *send = malloc(max_bytes), *recv = malloc(max_bytes);
    for (long i = 0; i < max_bytes / 4; i++) send[i] = (float)(i % 97) * 1e-3f;
    if (rank == 0) printf("# MPI_Allreduce fp32 sum, %d processes\n# bytes\tmean_us\tGB/s\n", size);
    for (long bytes = 4096; bytes <= max_bytes; bytes *= 4) {
        int count = (int)(bytes / 4);
        int iters = bytes >= (4L << 20) ? 20 : 200, warm = iters / 10;
        for (int i = 0; i < warm; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double local = (MPI_Wtime() - t0) / iters, mean;
        MPI_Reduce(&local, &mean, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        mean /= size;
        if (rank == 0) printf("%ld\t%.1f\t%.3f\n", bytes, mean * 1e6, bytes / mean / 1e9);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
