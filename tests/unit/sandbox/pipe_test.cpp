#define BOOST_TEST_MODULE sandbox_pipe
// Output pipes start at the kernel's default size and grow once to kBulkPipeBytes, the first
// time a read drains a full default pipe (sandbox::grow_output_pipe): quiet jobs never hold a
// 1 MiB pipe's slot array in the kernel, bulk writers still get the big pipe.
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/unique_fd.hpp"
#include "sandbox/prepare.hpp"

using cordon::UniqueFd;
namespace sandbox = cordon::sandbox;

namespace {

struct Pipe {
  UniqueFd r, w;
  Pipe() {
    int p[2];
    BOOST_TEST_REQUIRE(::pipe2(p, O_CLOEXEC) == 0, "pipe2: " << std::strerror(errno));
    r.reset(p[0]);
    w.reset(p[1]);
  }
  long size() const { return ::fcntl(r.get(), F_GETPIPE_SZ); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_partial_read_leaves_the_default_size) {
  Pipe p;
  BOOST_TEST_REQUIRE(p.size() == static_cast<long>(sandbox::kDefaultPipeBytes));
  bool grown = false;
  sandbox::grow_output_pipe(p.r.get(), 4096, grown);
  sandbox::grow_output_pipe(p.r.get(), sandbox::kDefaultPipeBytes - 1, grown);
  BOOST_TEST(!grown);
  BOOST_TEST(p.size() == static_cast<long>(sandbox::kDefaultPipeBytes));
}

BOOST_AUTO_TEST_CASE(a_read_of_a_full_default_pipe_grows_it_once) {
  Pipe p;
  bool grown = false;
  sandbox::grow_output_pipe(p.r.get(), sandbox::kDefaultPipeBytes, grown);
  BOOST_TEST(grown);
  BOOST_TEST(p.size() == sandbox::kBulkPipeBytes);
  // Once grown, it is left alone: shrunk behind its back, a later full read does not grow it.
  BOOST_TEST_REQUIRE(::fcntl(p.w.get(), F_SETPIPE_SZ, 4096) >= 0);
  sandbox::grow_output_pipe(p.r.get(), sandbox::kDefaultPipeBytes, grown);
  BOOST_TEST(p.size() == 4096);
}
