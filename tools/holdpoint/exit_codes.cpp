#include "commands.h"

namespace holdpoint::cli {

int exit_code_for(ErrorCode code) { return is_environment_error(code) ? kExitUsage : kExitInvalid; }

}  // namespace holdpoint::cli
