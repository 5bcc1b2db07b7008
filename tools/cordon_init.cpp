#include "sandbox/init.hpp"

int main() { return cordon::sandbox::init_main(); }
