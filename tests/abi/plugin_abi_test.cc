// Deliberately broken plugins: each is refused with one clear line, and nothing crashes.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "collie/config.h"
#include "collie/error.h"
#include "expect.h"
#include "plugin/loader.h"
#include "run_command.h"

namespace collie {
namespace {

std::string abiPlugin(const std::string& name) {
  return std::string(COLLIE_TEST_ABI_PLUGIN_DIR) + "/libcollie_scheduler_" + name + ".so";
}

std::string rejection(const std::string& name) {
  PluginKind kind = PluginKind::kScheduler;
  try {
    openPluginFile(abiPlugin(name), &kind);
  } catch (const PluginError& e) {
    return e.what();
  }
  return "";
}

struct BrokenCase {
  std::string plugin;
  std::string reason;
};

void PrintTo(const BrokenCase& c, std::ostream* os) { *os << c.plugin; }

class BrokenPlugin : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(BrokenPlugin, IsRejectedWithOneLineBeforeItRuns) {
  std::string m = rejection(GetParam().plugin);
  EXPECT_TRUE(testing::contains(m, {GetParam().reason, abiPlugin(GetParam().plugin)}))
      << "names the file: " << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
}

TEST_P(BrokenPlugin, CliExitsTwoWithTheSameLine) {
  auto r = testing::runCollie(
      {"run", std::string(COLLIE_TEST_SOURCE_DIR) + "/configs/ring-vs-tree.yaml", "--set",
       "bench.schedulers=[" + abiPlugin(GetParam().plugin) + "]", "--set", "bench.max_bytes=4KiB"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {GetParam().reason}));
}

INSTANTIATE_TEST_SUITE_P(
    Abi, BrokenPlugin,
    ::testing::Values(
        BrokenCase{"wrong_major", "plugin ABI " + std::to_string(COLLIE_ABI_MAJOR + 1) + "." +
                                      std::to_string(COLLIE_ABI_MINOR) +
                                      " is not supported: this collie speaks ABI " +
                                      std::to_string(COLLIE_ABI_MAJOR) + "." +
                                      std::to_string(COLLIE_ABI_MINOR)},
        BrokenCase{"newer_minor",
                   "plugin needs ABI " + std::to_string(COLLIE_ABI_MAJOR) + "." +
                       std::to_string(COLLIE_ABI_MINOR + 1) + " but this collie provides only " +
                       std::to_string(COLLIE_ABI_MAJOR) + "." + std::to_string(COLLIE_ABI_MINOR)},
        BrokenCase{"wrong_kind", "is a backend plugin, but the slot needs a scheduler"},
        BrokenCase{"no_symbol", "no 'collie_plugin_v1' descriptor symbol exported"},
        BrokenCase{"bad_magic", "bad descriptor magic: expected 0x434f4c4c, found 0xdeadbeef"},
        BrokenCase{"fingerprint", "build fingerprint mismatch"},
        BrokenCase{"not_elf", "not a shared library (no ELF header)"}),
    [](const auto& info) { return std::string(info.param.plugin); });

TEST(PluginAbi, CreateThatThrowsBecomesAPluginError) {
  PluginLoader loader({COLLIE_TEST_ABI_PLUGIN_DIR});
  Params params;
  EXPECT_TRUE(testing::throwsWith<PluginError>(
      [&] { loader.createScheduler("create_throws", params); },
      {"scheduler 'create_throws' failed to start: deliberate failure"}))
      << "no error";
  auto r =
      testing::runCollie({"run", std::string(COLLIE_TEST_SOURCE_DIR) + "/configs/ring-vs-tree.yaml",
                          "--set", "bench.schedulers=[create_throws]"},
                         {std::string("COLLIE_PLUGIN_PATH=") + COLLIE_TEST_ABI_PLUGIN_DIR});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"deliberate failure in the constructor"}));
}

TEST(PluginAbi, ParamsAreCheckedByThePlugin) {
  PluginLoader loader({COLLIE_TEST_ABI_PLUGIN_DIR});
  Params out_of_range("scheduler 'good'");
  out_of_range.set("knob", "11", "x.yaml:4:9");
  try {
    loader.createScheduler("good", out_of_range);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(testing::contains(std::string(e.what()),
                                  {"x.yaml:4:9: scheduler 'good': params.knob: expected an "
                                   "integer in [0, 10], found '11'"}));
  }
  Params typo("scheduler 'good'");
  typo.set("knbo", "1");
  try {
    loader.createScheduler("good", typo);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(
        testing::contains(std::string(e.what()), {"unknown param 'knbo' (did you mean 'knob'?)"}));
  }
}

TEST(PluginAbi, ObjectsKeepTheirLibraryLoaded) {
  std::shared_ptr<Scheduler> scheduler;
  {
    PluginLoader loader({COLLIE_TEST_ABI_PLUGIN_DIR});
    Params params;
    scheduler = loader.createScheduler("good", params);
  }  // the loader and every other handle are gone; the object still works
  CollectiveArgs args;
  EXPECT_FALSE(scheduler->accepts(args, Topology::singleNode(2)).accepted);
}

// An exception made by std::make_exception_ptr inside a plugin carries a destructor compiled
// into the plugin (an instance of std::__exception_ptr::__dest_thunk): once the plugin is
// unloaded, destroying the exception jumps into unmapped memory (docs/plugin-abi.md,
// Lifetime). No built plugin has one.
TEST(PluginAbi, NoPluginMakesAnExceptionWhoseDestructorDiesWithIt) {
  std::vector<std::string> files;
  std::stringstream list(COLLIE_TEST_PLUGIN_FILES);
  for (std::string file; std::getline(list, file, ',');) files.push_back(file);
  ASSERT_FALSE(files.empty()) << "the build names no plugin";
  for (const std::string& file : files) {
    const std::string path = std::string(COLLIE_TEST_PLUGIN_DIR) + "/" + file;
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " was built but is not there";
    std::string symbols;
    FILE* nm = ::popen((std::string(COLLIE_TEST_NM) + " -C '" + path + "' 2>&1").c_str(), "r");
    ASSERT_NE(nm, nullptr);
    char chunk[4096];
    for (size_t n; (n = std::fread(chunk, 1, sizeof(chunk), nm)) > 0;) symbols.append(chunk, n);
    ASSERT_EQ(::pclose(nm), 0) << path << ": " << symbols;
    ASSERT_TRUE(testing::contains(symbols, {"collie_plugin_v1"}))
        << path << ": nm shows no symbols (a stripped build cannot be checked)";
    EXPECT_EQ(symbols.find("__exception_ptr::__dest_thunk"), std::string::npos)
        << path << " makes an exception with std::make_exception_ptr";
  }
}

TEST(PluginAbi, LookupByNameAndByPathAndNoSilentFallback) {
  PluginLoader loader({"/nonexistent-dir", COLLIE_TEST_ABI_PLUGIN_DIR});
  EXPECT_EQ(pluginInfo(*loader.open(PluginKind::kScheduler, "good")).name, "good");
  EXPECT_EQ(pluginInfo(*loader.open(PluginKind::kScheduler, abiPlugin("good"))).name, "good");
  // A broken file found by name is an error, never skipped for another candidate.
  EXPECT_THROW(loader.open(PluginKind::kScheduler, "bad_magic"), PluginError);
  try {
    loader.open(PluginKind::kScheduler, "godo");
    FAIL();
  } catch (const PluginError& e) {
    std::string m = e.what();
    EXPECT_TRUE(testing::contains(m, {"did you mean 'good'?", "/nonexistent-dir"}));
  }
}

TEST(PluginAbi, ScanSeparatesValidAndRejectedFiles) {
  PluginLoader loader({COLLIE_TEST_ABI_PLUGIN_DIR});
  auto scan = loader.scan();
  std::set<std::string> found;
  for (const auto& p : scan.found) found.insert(p.name);
  EXPECT_TRUE(found.count("good"));
  EXPECT_TRUE(found.count("create_throws"));  // its descriptor is fine; create() is not called
  EXPECT_EQ(scan.rejected.size(), 6u);        // all but wrong_kind, which is a valid backend
}

}  // namespace
}  // namespace collie
