/* An MPI program for the Open MPI policy test: every rank fills COUNT floats with its own
 * pseudo-random values, MPI_Allreduce sums them, and rank 0 prints a 64-bit FNV-1a hash of
 * the result's bytes. Float addition is not associative, so the hash tells the algorithms
 * that add in different orders apart (ring from recursive doubling), run after run. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const long count = argc > 1 ? atol(argv[1]) : 0;
  if (count <= 0) {
    if (rank == 0) fprintf(stderr, "usage: allreduce_bits COUNT\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  float* in = malloc((size_t)count * sizeof(float));
  float* out = malloc((size_t)count * sizeof(float));
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(rank + 1);
  for (long i = 0; i < count; ++i) { /* xorshift64, values in [-0.5, 0.5) */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    in[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
  }
  MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    uint64_t hash = 14695981039346656037ull;
    const unsigned char* bytes = (const unsigned char*)out;
    for (long i = 0; i < count * (long)sizeof(float); ++i) {
      hash ^= bytes[i];
      hash *= 1099511628211ull;
    }
    printf("%016llx\n", (unsigned long long)hash);
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
