// Resume profiles without LibTorch: the names (which files store and never
// change meaning), and each profile's preconditions, one fact at a time, with
// check_profile's profile_precondition_violated.
#include <functional>
#include <string>
#include <vector>

#include "holdpoint/schema/resume_profile.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

// Facts that satisfy `profile`; each test then breaks one of them.
ProfileFacts satisfying(ResumeProfile profile) {
  ProfileFacts facts;
  facts.cpu_generator_registered = true;
  switch (profile) {
    case ResumeProfile::cpu_basic_v1: facts.sampler_kind = "sequential"; break;
    case ResumeProfile::cpu_shuffled_singleworker_v1:
      facts.sampler_kind = "random";
      facts.sampler_generator_registered = true;
      break;
    case ResumeProfile::cuda_single_device_v1:
      facts.model_on_cpu = false;
      facts.model_on_first_cuda_device = true;
      facts.cuda_available = true;
      facts.deterministic_algorithms = true;
      facts.all_cuda_generators_registered = true;
      break;
    case ResumeProfile::cpu_gloo_ddp_v1:
      facts.distributed = true;
      facts.world_size = 2;
      facts.rank_local_generators = true;
      facts.sampler_kind = "distributed";
      break;
    case ResumeProfile::unqualified: break;
  }
  return facts;
}

constexpr ResumeProfile kQualified[] = {ResumeProfile::cpu_basic_v1, ResumeProfile::cpu_shuffled_singleworker_v1,
                                        ResumeProfile::cuda_single_device_v1, ResumeProfile::cpu_gloo_ddp_v1};

struct Breach {
  const char* what;
  std::function<void(ProfileFacts&)> apply;
  std::vector<ResumeProfile> violated;  // the profiles this breach must fail
};

const std::vector<Breach>& breaches() {
  using P = ResumeProfile;
  static const std::vector<Breach> all = {
      {"model off the CPU", [](ProfileFacts& f) { f.model_on_cpu = false; },
       {P::cpu_basic_v1, P::cpu_shuffled_singleworker_v1, P::cpu_gloo_ddp_v1}},
      {"loader workers", [](ProfileFacts& f) { f.loader_workers = 2; },
       {P::cpu_basic_v1, P::cpu_shuffled_singleworker_v1, P::cuda_single_device_v1, P::cpu_gloo_ddp_v1}},
      {"external randomness", [](ProfileFacts& f) { f.external_randomness = true; },
       {P::cpu_basic_v1, P::cpu_shuffled_singleworker_v1, P::cuda_single_device_v1, P::cpu_gloo_ddp_v1}},
      {"CPU generator unregistered", [](ProfileFacts& f) { f.cpu_generator_registered = false; },
       {P::cpu_basic_v1, P::cpu_shuffled_singleworker_v1, P::cuda_single_device_v1, P::cpu_gloo_ddp_v1}},
      {"no sampler", [](ProfileFacts& f) { f.sampler_kind.clear(); },
       {P::cpu_basic_v1, P::cpu_shuffled_singleworker_v1, P::cpu_gloo_ddp_v1}},
      {"no CUDA", [](ProfileFacts& f) { f.cuda_available = false; }, {P::cuda_single_device_v1}},
      {"model off the first CUDA device", [](ProfileFacts& f) { f.model_on_first_cuda_device = false; },
       {P::cuda_single_device_v1}},
      {"nondeterministic algorithms", [](ProfileFacts& f) { f.deterministic_algorithms = false; },
       {P::cuda_single_device_v1}},
      {"a CUDA generator unregistered", [](ProfileFacts& f) { f.all_cuda_generators_registered = false; },
       {P::cuda_single_device_v1}},
      {"generators saved for all ranks at once", [](ProfileFacts& f) { f.rank_local_generators = false; },
       {P::cpu_gloo_ddp_v1}},
  };
  return all;
}

bool contains(const std::vector<ResumeProfile>& profiles, ResumeProfile profile) {
  for (const auto p : profiles) {
    if (p == profile) return true;
  }
  return false;
}

// ---- names -----------------------------------------------------------------------------

TEST(ResumeProfile, NamesAreTheVersionedSpellingsFilesStore) {
  EXPECT_EQ(resume_profile_name(ResumeProfile::cpu_basic_v1), "cpu-basic-v1");
  EXPECT_EQ(resume_profile_name(ResumeProfile::cpu_shuffled_singleworker_v1), "cpu-shuffled-singleworker-v1");
  EXPECT_EQ(resume_profile_name(ResumeProfile::cuda_single_device_v1), "cuda-single-device-v1");
  EXPECT_EQ(resume_profile_name(ResumeProfile::cpu_gloo_ddp_v1), "cpu-gloo-ddp-v1");
  EXPECT_EQ(resume_profile_name(ResumeProfile::unqualified), "unqualified");
}

TEST(ResumeProfile, EveryNameReadsBackAsItsProfile) {
  for (const auto profile : {ResumeProfile::cpu_basic_v1, ResumeProfile::cpu_shuffled_singleworker_v1,
                             ResumeProfile::cuda_single_device_v1, ResumeProfile::cpu_gloo_ddp_v1,
                             ResumeProfile::unqualified}) {
    EXPECT_EQ(resume_profile_from_name(resume_profile_name(profile)), profile);
  }
}

TEST(ResumeProfileRejects, NamesThatAreNotExactlyAProfile) {
  for (const char* name : {"", "cpu-basic", "cpu-basic-v2", "CPU-BASIC-V1", "cpu_basic_v1", " cpu-basic-v1",
                           "cpu-basic-v1 ", "unknown", "Unqualified"}) {
    EXPECT_FALSE(resume_profile_from_name(name).has_value()) << "'" << name << "'";
  }
}

// ---- preconditions -------------------------------------------------------------------------

TEST(ResumeProfile, SatisfyingFactsPassEveryProfile) {
  for (const auto profile : kQualified) {
    SCOPED_TRACE(resume_profile_name(profile));
    EXPECT_TRUE(profile_violations(profile, satisfying(profile)).empty());
    check_profile(profile, satisfying(profile));
  }
}

TEST(ResumeProfile, UnqualifiedHasNoPreconditions) {
  ProfileFacts anything;
  anything.model_on_cpu = false;
  anything.loader_workers = 8;
  anything.distributed = true;
  anything.external_randomness = true;
  EXPECT_TRUE(profile_violations(ResumeProfile::unqualified, anything).empty());
  check_profile(ResumeProfile::unqualified, anything);
}

TEST(ResumeProfile, ACustomStatefulSamplerNeedsNoRegisteredGenerator) {
  ProfileFacts facts = satisfying(ResumeProfile::cpu_shuffled_singleworker_v1);
  facts.sampler_kind = "custom";
  facts.sampler_generator_registered = false;
  EXPECT_TRUE(profile_violations(ResumeProfile::cpu_shuffled_singleworker_v1, facts).empty());
}

TEST(ResumeProfileRejects, EachBrokenPreconditionInTheProfilesThatStateIt) {
  for (const Breach& breach : breaches()) {
    for (const auto profile : kQualified) {
      SCOPED_TRACE(std::string(breach.what) + " under " + std::string(resume_profile_name(profile)));
      ProfileFacts facts = satisfying(profile);
      breach.apply(facts);
      const auto violations = profile_violations(profile, facts);
      if (contains(breach.violated, profile)) {
        EXPECT_EQ(violations.size(), 1u);
        EXPECT_ERROR_CODE(check_profile(profile, facts), ErrorCode::profile_precondition_violated);
      } else {
        EXPECT_TRUE(violations.empty());
      }
    }
  }
}

TEST(ResumeProfileRejects, DistributedTrainingUnderASingleProcessProfile) {
  for (const auto profile :
       {ResumeProfile::cpu_basic_v1, ResumeProfile::cpu_shuffled_singleworker_v1, ResumeProfile::cuda_single_device_v1}) {
    SCOPED_TRACE(resume_profile_name(profile));
    ProfileFacts facts = satisfying(profile);
    facts.distributed = true;
    EXPECT_EQ(profile_violations(profile, facts).size(), 1u);
    EXPECT_ERROR_CODE(check_profile(profile, facts), ErrorCode::profile_precondition_violated);
  }
}

TEST(ResumeProfileRejects, SingleProcessTrainingUnderTheDdpProfile) {
  ProfileFacts facts = satisfying(ResumeProfile::cpu_gloo_ddp_v1);
  facts.distributed = false;
  EXPECT_EQ(profile_violations(ResumeProfile::cpu_gloo_ddp_v1, facts).size(), 1u);
  EXPECT_ERROR_CODE(check_profile(ResumeProfile::cpu_gloo_ddp_v1, facts), ErrorCode::profile_precondition_violated);
}

TEST(ResumeProfileRejects, ASamplerOfAnotherKind) {
  const std::pair<ResumeProfile, const char*> cases[] = {
      {ResumeProfile::cpu_basic_v1, "random"},
      {ResumeProfile::cpu_basic_v1, "distributed"},
      {ResumeProfile::cpu_shuffled_singleworker_v1, "sequential"},
      {ResumeProfile::cpu_shuffled_singleworker_v1, "distributed"},
      {ResumeProfile::cpu_gloo_ddp_v1, "random"},
      {ResumeProfile::cpu_gloo_ddp_v1, "sequential"},
  };
  for (const auto& [profile, kind] : cases) {
    SCOPED_TRACE(std::string(resume_profile_name(profile)) + " with " + kind);
    ProfileFacts facts = satisfying(profile);
    facts.sampler_kind = kind;
    EXPECT_FALSE(profile_violations(profile, facts).empty());
    EXPECT_ERROR_CODE(check_profile(profile, facts), ErrorCode::profile_precondition_violated);
  }
}

TEST(ResumeProfileRejects, ARandomSamplerWhoseGeneratorIsNotRegistered) {
  ProfileFacts facts = satisfying(ResumeProfile::cpu_shuffled_singleworker_v1);
  facts.sampler_generator_registered = false;
  EXPECT_EQ(profile_violations(ResumeProfile::cpu_shuffled_singleworker_v1, facts).size(), 1u);
  EXPECT_ERROR_CODE(check_profile(ResumeProfile::cpu_shuffled_singleworker_v1, facts),
                    ErrorCode::profile_precondition_violated);
}

TEST(ResumeProfileRejects, EveryViolationIsListedNotJustTheFirst) {
  ProfileFacts facts = satisfying(ResumeProfile::cpu_basic_v1);
  facts.loader_workers = 4;
  facts.external_randomness = true;
  facts.cpu_generator_registered = false;
  const auto violations = profile_violations(ResumeProfile::cpu_basic_v1, facts);
  ASSERT_EQ(violations.size(), 3u);
  try {
    check_profile(ResumeProfile::cpu_basic_v1, facts);
    FAIL() << "violations accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::profile_precondition_violated);
    EXPECT_NE(error.detail().find("cpu-basic-v1"), std::string::npos) << error.detail();
    for (const auto& violation : violations) {
      EXPECT_NE(error.detail().find(violation), std::string::npos) << violation << " not in: " << error.detail();
    }
  }
}

}  // namespace
}  // namespace holdpoint
