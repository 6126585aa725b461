// Launcher environments, most specific first: collie's and torchrun's RANK/WORLD_SIZE, then
// Open MPI, then Slurm.
#include "runtime/environment.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "collie/error.h"
#include "core/strings.h"

namespace collie {
namespace {

class Reader {
 public:
  explicit Reader(std::function<const char*(const char*)> getenv) : getenv_(std::move(getenv)) {}

  bool has(const char* name) const { return getenv_(name) != nullptr; }

  // The integer in `name`, or `fallback` when it is unset. Throws on anything but digits.
  long integer(const char* name, long fallback, long min, long max) const {
    const char* text = getenv_(name);
    if (text == nullptr) return fallback;
    char* end = nullptr;
    errno = 0;
    long value = std::strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || errno != 0 || value < min || value > max) {
      throw ConfigError(fmt::format("environment variable {}='{}': expected an integer in [{}, {}]",
                                    name, text, min, max));
    }
    return value;
  }

  std::string text(const char* name) const {
    const char* value = getenv_(name);
    return value == nullptr ? "" : value;
  }

 private:
  std::function<const char*(const char*)> getenv_;
};

constexpr long kMaxRanks = 1 << 20;

}  // namespace

int localRankOf(const Topology& topology, int rank) {
  const WorkerEnv env = detectWorkerEnv();
  return env.present ? env.local_rank : topology.localRank(rank);
}

WorkerEnv detectWorkerEnv(const std::function<const char*(const char*)>& getenv) {
  Reader env(getenv ? getenv : [](const char* name) -> const char* { return std::getenv(name); });
  WorkerEnv w;
  const char* rank_var = nullptr;
  const char* world_var = nullptr;
  // The four numbers under one launcher's names (no local world size: left as it is).
  auto read = [&](const char* rank, const char* world, const char* local_rank,
                  const char* local_world) {
    rank_var = rank;
    world_var = world;
    w.rank = env.integer(rank, -1, 0, kMaxRanks);
    w.world = env.integer(world, -1, 1, kMaxRanks);
    w.local_rank = env.integer(local_rank, w.rank, 0, kMaxRanks);
    if (local_world != nullptr) w.local_world = env.integer(local_world, w.world, 1, kMaxRanks);
  };
  if (env.has("RANK") || env.has("WORLD_SIZE")) {
    w.source = env.has("COLLIE_EXPERIMENT") ? "collie" : "torchrun";
    read("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  } else if (env.has("OMPI_COMM_WORLD_RANK")) {
    w.source = "Open MPI";
    read("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE");
  } else if (env.has("SLURM_PROCID") && env.has("SLURM_NTASKS")) {
    w.source = "Slurm";
    read("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr);
    // SLURM_NTASKS_PER_NODE may read "2(x3)"; the step's node count tells one node from many.
    long nodes = env.integer("SLURM_STEP_NUM_NODES", env.integer("SLURM_NNODES", 1, 1, kMaxRanks),
                             1, kMaxRanks);
    w.local_world = nodes == 1 ? w.world : 0;  // 0: not known, only used to tell 1 node
  } else {
    return w;
  }
  if (w.rank < 0 || w.world < 1) {
    throw ConfigError(std::string("environment: ") + rank_var + " and " + world_var +
                      " must both be set (found only one); a launcher (" + w.source +
                      ") sets them together");
  }
  if (w.rank >= w.world) {
    throw ConfigError(
        fmt::format("environment: {}={} is not below {}={}", rank_var, w.rank, world_var, w.world));
  }
  w.present = true;
  w.master_addr = env.text("MASTER_ADDR");
  w.master_port = static_cast<uint16_t>(env.integer("MASTER_PORT", 0, 1, 65535));
  w.experiment = static_cast<int>(env.integer("COLLIE_EXPERIMENT", -1, 0, kMaxRanks));
  w.result_path = env.text("COLLIE_RESULT");
  if (w.master_addr.empty() && w.local_world != w.world) {
    throw ConfigError(fmt::format(
        "environment: {} started {} ranks on several nodes but MASTER_ADDR is not set. HINT: "
        "export MASTER_ADDR (rank 0's host) and MASTER_PORT to every rank, e.g. mpirun -x "
        "MASTER_ADDR=node1 -x MASTER_PORT=29500",
        w.source, w.world));
  }
  return w;
}

std::string drawJobToken() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n <= 0) throw InternalError("cannot draw a job token from getrandom()");
    got += static_cast<size_t>(n);
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

namespace {

// Writes `text` to `path` with mode 0600 so that it appears whole: other nodes wait for the
// file to exist and read it at once, so it is written beside it and renamed into place.
// `subject` names the file for the message ("launch.token_file PATH"), `hint` what to do.
void writeWhole(const std::string& path, const std::string& text, const std::string& subject,
                const char* hint) {
  std::string aside = path + ".tmp.XXXXXX";  // a name of its own, made mode 0600
  bool made = false;
  const auto failed = [&](const char* what) {
    const std::string why = std::strerror(errno);
    if (made) ::unlink(aside.c_str());  // only the scratch file this call made
    return ConfigError(fmt::format("{}: cannot write a job token there ({} {}: {}). HINT: {}",
                                   subject, what, aside, why, hint));
  };
  const int fd = ::mkostemp(aside.data(), O_CLOEXEC);
  if (fd < 0) throw failed("create");
  made = true;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;  // nothing written and no error: say so rather than a stale one
      ::close(fd);
      throw failed("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    throw failed("fsync");
  }
  if (::close(fd) != 0) throw failed("close");
  if (::rename(aside.c_str(), path.c_str()) != 0) throw failed("rename");
}

// COLLIE_JOB_TOKEN, or "".
std::string exportedToken() {
  const char* token = std::getenv("COLLIE_JOB_TOKEN");
  return token == nullptr ? "" : token;
}

}  // namespace

std::string jobToken(const std::string& token_file) {
  if (std::string token = exportedToken(); !token.empty()) return token;
  if (token_file.empty()) return "";
  std::ifstream in(token_file);
  std::string token;
  if (in) std::getline(in, token);
  token = detail::trim(token);  // a copy made on another system may end in \r
  if (token.empty()) {
    throw ConfigError(fmt::format(
        "launch.token_file {}: cannot read a job token from it. HINT: node 0's launcher writes "
        "it; every other node needs a copy (or a shared file system)",
        token_file));
  }
  return token;
}

void provideJobToken(const std::string& token_file, bool may_create,
                     std::chrono::milliseconds patience) {
  if (!exportedToken().empty()) return;
  std::string token;
  struct stat st {};
  if (token_file.empty()) {
    token = drawJobToken();
  } else if (::stat(token_file.c_str(), &st) != 0 && may_create) {
    token = drawJobToken();
    writeWhole(token_file, token + "\n", "launch.token_file " + token_file,
               "point launch.token_file at a folder this user may write on node 0");
  } else {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (::stat(token_file.c_str(), &st) != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    token = jobToken(token_file);
  }
  ::setenv("COLLIE_JOB_TOKEN", token.c_str(), 1);
}

namespace {

// This user's folder for local job tokens, made with mode 0700 when missing; a folder that
// another user owns or may read (made by someone else in /tmp first) is refused. An
// inherited XDG_RUNTIME_DIR that is not this user's existing folder (srun exports the login
// node's; su and containers keep the caller's) is passed over for /tmp.
std::string privateTokenFolder() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  struct stat st {};
  const bool runtime_usable = runtime != nullptr && *runtime != '\0' && ::stat(runtime, &st) == 0 &&
                              S_ISDIR(st.st_mode) && st.st_uid == ::geteuid();
  const std::string folder = runtime_usable ? std::string(runtime) + "/collie"
                                            : fmt::format("/tmp/collie-{}", ::geteuid());
  constexpr const char* kHint = "HINT: export the same COLLIE_JOB_TOKEN to every rank";
  if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) {
    throw ConfigError(fmt::format("cannot make {} for the job token: {}. {}", folder,
                                  std::strerror(errno), kHint));
  }
  if (::lstat(folder.c_str(), &st) != 0) {
    throw ConfigError(fmt::format("cannot inspect {} for the job token: {}. {}", folder,
                                  std::strerror(errno), kHint));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    throw ConfigError(fmt::format(
        "{} is not a private folder of this user (owner uid {}, mode {:o}), so another user "
        "could read the job's token there. HINT: remove it, or export the same "
        "COLLIE_JOB_TOKEN to every rank",
        folder, st.st_uid, st.st_mode & 07777));
  }
  return folder;
}

}  // namespace

std::string localJobTokenPath(uint16_t port) {
  return fmt::format("{}/job-{}.token", privateTokenFolder(), port);
}

void writeLocalJobToken(const std::string& path, const std::string& token) {
  writeWhole(path, token + "\n", path,
             "free space there, or export the same COLLIE_JOB_TOKEN to every rank");
}

std::string readLocalJobToken(const std::string& path,
                              std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    std::ifstream in(path);
    std::string token;
    if (in && std::getline(in, token) && !detail::trim(token).empty()) return detail::trim(token);
    if (std::chrono::steady_clock::now() >= deadline) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void leaveErrorForLauncher(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  // torchrun reads {"message": TEXT, "timestamp": SECONDS} and names the earliest failure.
  const nlohmann::json error = {{"message", message},
                                {"timestamp", static_cast<int64_t>(std::time(nullptr))}};
  std::ofstream(path) << error.dump() << "\n";
}

}  // namespace collie
