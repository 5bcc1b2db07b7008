#define BOOST_TEST_MODULE cgroup
#include <boost/test/unit_test.hpp>
BOOST_AUTO_TEST_CASE(placeholder) {}
