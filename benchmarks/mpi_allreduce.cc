// Open MPI's MPI_Allreduce: the peer collie's schedulers over ucx (shared memory) and gloo
// (TCP) are compared against. Run with mpirun; the BTL chooses the transport.
//
//   mpirun -np N [--mca btl self,vader | self,tcp] mpi_allreduce LABEL MIN_BYTES MAX_BYTES ITERS
//
// Prints CSV rows: peer,algorithm,ranks,bytes,time_us,busbw_gbps (the slowest rank's mean).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 5) {
    if (rank == 0) std::fprintf(stderr, "usage: %s LABEL MIN_BYTES MAX_BYTES ITERS\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const size_t min_bytes = std::strtoull(argv[2], nullptr, 10);
  const size_t max_bytes = std::strtoull(argv[3], nullptr, 10);
  const int iters = std::atoi(argv[4]);
  std::vector<float> data(max_bytes / sizeof(float), 1.0f);
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int count = static_cast<int>(bytes / sizeof(float));
    for (int i = 0; i < 2; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double seconds = (MPI_Wtime() - start) / iters, worst = 0;
    MPI_Reduce(&seconds, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      double busbw = bytes / worst / 1e9 * 2.0 * (size - 1) / size;
      std::printf("mpi,%s,%d,%zu,%.2f,%.4f\n", argv[1], size, bytes, worst * 1e6, busbw);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
