// `flashcache inspect`: its table against a compress run's energy ratios, and bad files.
#include "cli_harness.hpp"

namespace flashcache {
namespace {

using namespace cli_test;  // the tests' own harness
using test::lines_of;
using test::TempDir;

// The table's R_l column matches energy_ratio.npy of a compress run with the same transform.
TEST_F(CliTest, InspectPrintsATable) {
  for (const std::vector<std::string>& t :
       {std::vector<std::string>{},
        std::vector<std::string>{"--gamma", "0.3", "--transform", "blocked", "--block", "8"}}) {
    std::vector<std::string> args = compress({"--force"});
    args.insert(args.end(), t.begin(), t.end());
    ASSERT_EQ(run_cli(args).code, 0);
    const npy::Array ratio = npy::read(out + "/energy_ratio.npy");

    args = {"inspect", "--k", k, "--v", v};
    args.insert(args.end(), t.begin(), t.end());
    const Result r = run_cli(args);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    int rows = 0;
    bool header = false, total = false;
    for (const std::string& line : lines_of(r.out)) {
      std::istringstream in(line);
      std::string first;
      in >> first;
      if (first == "layer") header = line.find("K below cutoff") != std::string::npos;
      if (first == "total") total = true;
      if (first == "0" || first == "1") {
        double k_low = -1, v_low = -1, r_l = -1;
        in >> k_low >> v_low >> r_l;
        EXPECT_TRUE(k_low >= 0 && k_low <= 1 && v_low >= 0 && v_low <= 1) << line;
        EXPECT_NEAR(r_l, ratio.data<double>()[std::stoi(first)], 2e-6) << line;
        ++rows;
      }
    }
    EXPECT_TRUE(header) << r.out;
    EXPECT_TRUE(total) << r.out;
    EXPECT_EQ(rows, 2) << r.out;
  }
}

TEST_F(CliTest, InspectRefusesBadFiles) {
  std::string b = test::read_bytes(v);
  b[0] = 'X';
  test::write_bytes(v, b);
  const Result r = run_cli({"inspect", "--k", k, "--v", v});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "flashcache: " + v + ": not a .npy file (wrong magic)\n");
}

}  // namespace
}  // namespace flashcache
