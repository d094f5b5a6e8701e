#include "commands.h"

namespace holdpoint::cli {

int exit_code_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
    case ErrorCode::io_open_failed:
    case ErrorCode::io_read_failed:
    case ErrorCode::io_write_failed:
    case ErrorCode::io_sync_failed:
    case ErrorCode::io_rename_failed:
    case ErrorCode::io_not_regular_file:
    case ErrorCode::sha256_invalid:
    case ErrorCode::export_destination_invalid: return kExitUsage;
    default: return kExitInvalid;
  }
}

}  // namespace holdpoint::cli
