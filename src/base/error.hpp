#pragma once

#include "cordon/error.hpp"
