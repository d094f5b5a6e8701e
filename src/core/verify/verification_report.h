// DIR/verification.json: everything a resume verification did and found
// (docs/verification.md, "verification.json"). Built from the result, so the
// file and the returned ResumeVerification never disagree.
//
// Thread-safety: a pure function.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "holdpoint/verify/resume_verifier.h"

namespace holdpoint::verify {

inline constexpr std::string_view kVerificationSchema = "holdpoint.resume-verification";
inline constexpr int kVerificationSchemaVersion = 1;

struct ReportContext {
  std::vector<std::string> trainer_command;  // the program (resolved) and --trainer-arg values
  std::vector<std::pair<std::string, std::string>> trainer_versions;  // from the continuous run's summary
  std::string trainer_name;                                           // its summary's "trainer"
};

std::string verification_report_json(const ResumeVerificationOptions& options, const ResumeVerification& result,
                                     const ReportContext& context);

// The compiler that built holdpoint ("gcc 12.2.0"), for the report.
std::string compiler_version();

}  // namespace holdpoint::verify
