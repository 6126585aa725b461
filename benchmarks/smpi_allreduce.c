/* The SMPI peer of benchmarks/simgrid_scale.sh: one MPI_Allreduce of argv[1] bytes (f32 sum)
 * under SimGrid's SMPI, its buffers shared (SMPI_SHARED_MALLOC: no payload per rank, as
 * collie's payload: false), printing the slowest rank's simulated time. Built with smpicc
 * by the script. */
#include <mpi.h>
#include <smpi/smpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const long count = atol(argv[1]) / 4;
  float* in = SMPI_SHARED_MALLOC(count * 4);
  float* out = SMPI_SHARED_MALLOC(count * 4);
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double took = MPI_Wtime() - start;
  double slowest = 0;
  MPI_Reduce(&took, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("smpi allreduce %ld B: %.3f us simulated\n", count * 4, slowest * 1e6);
  SMPI_SHARED_FREE(in);
  SMPI_SHARED_FREE(out);
  MPI_Finalize();
  return 0;
}
