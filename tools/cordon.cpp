#include "api/cli.hpp"

int main(int argc, char** argv) { return cordon::api::cli_main(argc, argv); }
