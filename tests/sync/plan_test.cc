// PlanCatchUp: checked against brute-force enumeration of every chain on
// random manifests, plus the cases a replica meets in practice.
#include "deltasync/plan.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>

namespace deltasync {
namespace {

ObjectEntry AnchorObj(uint64_t v, uint64_t size) {
  return {PatchKind::kAnchor, CompressedAnchorKey(v), IndexEncoding::kCompact, size, std::string(32, 'a'),
          std::nullopt};
}
ObjectEntry DeltaObj(uint64_t v, uint64_t base, uint64_t size) {
  return {PatchKind::kDelta, CumulativeDeltaKey(base, v, IndexEncoding::kCompact), IndexEncoding::kCompact, size,
          std::string(32, 'd'), base};
}
VersionEntry Entry(uint64_t v, std::vector<ObjectEntry> objects) {
  VersionEntry e;
  e.version = v;
  e.objects = std::move(objects);
  return e;
}

struct Cost {
  uint64_t bytes = std::numeric_limits<uint64_t>::max();
  uint64_t objects = 0;
};

// Every chain ending at `v`, by recursion over the objects (exponential:
// small manifests only). Reaching `held` costs nothing.
Cost BruteForce(const Manifest& m, uint64_t held, uint64_t v, uint64_t floor, const ObjectSet& avoid = {}) {
  if (v == held) return {0, 0};
  Cost best;
  const VersionEntry* e = m.Find(v);
  if (!e || v < floor) return best;
  for (const ObjectEntry& o : e->objects) {
    if (avoid.count(ObjectRef{o.key, o.xxh3_128})) continue;
    Cost c{o.size, 1};
    if (o.kind == PatchKind::kDelta) {
      Cost base = BruteForce(m, held, *o.base_version, floor, avoid);
      if (base.bytes == std::numeric_limits<uint64_t>::max()) continue;
      c.bytes += base.bytes;
      c.objects += base.objects;
    }
    if (c.bytes < best.bytes || (c.bytes == best.bytes && c.objects < best.objects)) best = c;
  }
  return best;
}

// A plan must be a real chain: starts at an anchor or at the held version,
// each delta's base is what the previous step reached, ends at the target.
void ExpectValidChain(const CatchUpPlan& plan, uint64_t held, uint64_t target) {
  ASSERT_FALSE(plan.steps.empty());
  uint64_t at = held, bytes = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const PlanStep& s = plan.steps[i];
    if (s.object.kind == PatchKind::kAnchor) {
      EXPECT_EQ(i, 0u) << "an anchor only starts a chain";
    } else {
      EXPECT_EQ(*s.object.base_version, at) << "step " << i;
      EXPECT_GT(s.version, at);
    }
    at = s.version;
    bytes += s.object.size;
  }
  EXPECT_EQ(at, target);
  EXPECT_EQ(bytes, plan.bytes);
}

TEST(PlanTest, MatchesBruteForceOnRandomManifests) {
  std::mt19937_64 rng(20261129);
  int checked = 0, unreachable = 0;
  for (int round = 0; round < 400; ++round) {
    Manifest m;
    const int n = 2 + static_cast<int>(rng() % 14);
    std::vector<uint64_t> versions;
    uint64_t v = 1 + rng() % 3;
    for (int i = 0; i < n; ++i, v += 1 + rng() % 3) versions.push_back(v);
    uint64_t last_anchor = versions[0];
    for (size_t i = 0; i < versions.size(); ++i) {
      std::vector<ObjectEntry> objs;
      bool anchor = i == 0 || rng() % 4 == 0;
      if (!anchor || rng() % 2) {
        if (i > 0) objs.push_back(DeltaObj(versions[i], versions[i - 1], 10 + rng() % 200));
      }
      if (i > 1 && rng() % 3 == 0 && last_anchor != versions[i - 1]) {
        objs.push_back(DeltaObj(versions[i], last_anchor, 10 + rng() % 400));
      }
      if (i > 2 && rng() % 5 == 0) {  // an arbitrary older base (after gc, or a future publisher)
        uint64_t base = versions[rng() % (i - 1)];
        bool taken = false;
        for (const ObjectEntry& o : objs) taken |= o.base_version == base;
        if (!taken) objs.push_back(DeltaObj(versions[i], base, 10 + rng() % 300));
      }
      if (anchor) {
        objs.push_back(AnchorObj(versions[i], 300 + rng() % 1500));
        last_anchor = versions[i];
      }
      if (objs.empty()) objs.push_back(AnchorObj(versions[i], 500));
      m.versions.push_back(Entry(versions[i], std::move(objs)));
    }
    // Survives the manifest's own validation.
    ASSERT_TRUE(Manifest::Parse(ByteSpan(reinterpret_cast<const uint8_t*>(m.ToJson().data()), m.ToJson().size()))
                    .ok());
    std::vector<const ObjectEntry*> all;
    for (const VersionEntry& e : m.versions) {
      for (const ObjectEntry& o : e.objects) all.push_back(&o);
    }
    for (int q = 0; q < 12; ++q) {
      uint64_t target = versions[rng() % versions.size()];
      uint64_t held = rng() % 3 == 0 ? 0 : versions[rng() % versions.size()];
      if (held > target) std::swap(held, target);
      // Half the queries avoid a random set of objects (known bad).
      ObjectSet avoid;
      if (q % 2 == 1) {
        for (const ObjectEntry* o : all) {
          if (rng() % 4 == 0) avoid.insert(RefOf(*o));
        }
      }
      Result<CatchUpPlan> plan = PlanCatchUp(m, held, target, avoid);
      // Forward (through versions >= held) when possible, else any chain.
      Cost expected = BruteForce(m, held, target, held, avoid);
      const bool forward = expected.bytes != std::numeric_limits<uint64_t>::max();
      if (!forward) expected = BruteForce(m, held, target, 0, avoid);
      if (held == target) {
        ASSERT_TRUE(plan.ok());
        EXPECT_TRUE(plan->steps.empty());
        continue;
      }
      if (expected.bytes == std::numeric_limits<uint64_t>::max()) {
        EXPECT_FALSE(avoid.empty()) << "the first version is an anchor: always reachable without avoid";
        EXPECT_EQ(plan.status().code(), ErrorCode::kNotFound) << "round " << round;
        ++unreachable;
        continue;
      }
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      ExpectValidChain(*plan, held, target);
      for (const PlanStep& s : plan->steps) EXPECT_FALSE(avoid.count(RefOf(s.object))) << "uses an avoided object";
      EXPECT_EQ(plan->bytes, expected.bytes) << "round " << round << " held " << held << " target " << target;
      EXPECT_EQ(plan->steps.size(), expected.objects) << "round " << round;
      if (forward) EXPECT_GE(plan->steps.front().version, held);
      ++checked;
    }
  }
  EXPECT_GT(checked, 3000);
  EXPECT_GT(unreachable, 50);  // the avoid sets do cut routes
}

TEST(PlanTest, AvoidsAnObjectByKeyAndContent) {
  // 1..9, anchor 1, steps, cumulative 1->9 (cheapest) damaged: the steps.
  Manifest m;
  m.versions.push_back(Entry(1, {AnchorObj(1, 1000)}));
  for (uint64_t v = 2; v <= 9; ++v) {
    std::vector<ObjectEntry> objs{DeltaObj(v, v - 1, 100)};
    if (v == 9) objs.push_back(DeltaObj(9, 1, 150));
    m.versions.push_back(Entry(v, std::move(objs)));
  }
  const ObjectEntry cumulative = m.versions.back().objects[1];
  Result<CatchUpPlan> plain = PlanCatchUp(m, 1, 9);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->bytes, 150u);
  Result<CatchUpPlan> around = PlanCatchUp(m, 1, 9, {RefOf(cumulative)});
  ASSERT_TRUE(around.ok());
  EXPECT_EQ(around->steps.size(), 8u);
  EXPECT_EQ(around->bytes, 800u);
  // The same key listed with other content (republished) is another object.
  Result<CatchUpPlan> other = PlanCatchUp(m, 1, 9, {ObjectRef{cumulative.key, std::string(32, 'f')}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->bytes, 150u);
  // Nothing left: kNotFound saying so.
  ObjectSet everything;
  for (const VersionEntry& e : m.versions) {
    for (const ObjectEntry& o : e.objects) everything.insert(RefOf(o));
  }
  Result<CatchUpPlan> none = PlanCatchUp(m, 1, 9, everything);
  EXPECT_EQ(none.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(none.status().message().find("known bad"), std::string::npos) << none.status().ToString();
}

TEST(PlanTest, CumulativeDeltaBeatsTheSumOfSteps) {
  Manifest m;
  m.versions.push_back(Entry(10, {AnchorObj(10, 1000)}));
  for (uint64_t v = 11; v <= 15; ++v) {
    std::vector<ObjectEntry> objs{DeltaObj(v, v - 1, 60)};
    if (v == 15) objs.push_back(DeltaObj(15, 10, 150));  // 150 < 5 x 60
    m.versions.push_back(Entry(v, std::move(objs)));
  }
  m.versions.push_back(Entry(16, {DeltaObj(16, 15, 60)}));
  // Fresh replica: anchor + cumulative + one step.
  Result<CatchUpPlan> fresh = PlanCatchUp(m, std::nullopt, 16);
  ASSERT_TRUE(fresh.ok());
  ASSERT_EQ(fresh->steps.size(), 3u);
  EXPECT_EQ(fresh->steps[0].object.kind, PatchKind::kAnchor);
  EXPECT_EQ(fresh->steps[1].object.base_version, 10u);
  EXPECT_EQ(fresh->steps[1].version, 15u);
  EXPECT_EQ(fresh->bytes, 1000u + 150 + 60);
  // Held at 10 (the anchor): the cumulative delta, not five steps.
  Result<CatchUpPlan> from_anchor = PlanCatchUp(m, 10, 15);
  ASSERT_TRUE(from_anchor.ok());
  EXPECT_EQ(from_anchor->bytes, 150u);
  // Held at 13: two steps (120) beat anything through the anchor.
  Result<CatchUpPlan> from_13 = PlanCatchUp(m, 13, 16);
  ASSERT_TRUE(from_13.ok());
  EXPECT_EQ(from_13->bytes, 180u);
  EXPECT_EQ(from_13->steps.front().object.base_version, 13u);
}

TEST(PlanTest, FarBehindRestartsFromTheNewestUsefulAnchor) {
  Manifest m;
  m.versions.push_back(Entry(1, {AnchorObj(1, 1000)}));
  for (uint64_t v = 2; v <= 30; ++v) {
    std::vector<ObjectEntry> objs{DeltaObj(v, v - 1, 100)};
    if (v % 10 == 0) objs.push_back(AnchorObj(v, 1000));
    m.versions.push_back(Entry(v, std::move(objs)));
  }
  Result<CatchUpPlan> plan = PlanCatchUp(m, 3, 25);  // 22 steps = 2200 > anchor 20 + 5 steps = 1500
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->steps.front().version, 20u);
  EXPECT_EQ(plan->bytes, 1500u);
  Result<CatchUpPlan> near = PlanCatchUp(m, 23, 25);
  ASSERT_TRUE(near.ok());
  EXPECT_EQ(near->bytes, 200u);
}

TEST(PlanTest, ErrorsNameTheVersion) {
  Manifest m;
  m.versions.push_back(Entry(5, {AnchorObj(5, 10)}));
  m.versions.push_back(Entry(6, {DeltaObj(6, 5, 1)}));
  Result<CatchUpPlan> missing = PlanCatchUp(m, 0, 7);
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("version 7"), std::string::npos);
  EXPECT_EQ(PlanCatchUp(m, 6, 5).status().code(), ErrorCode::kInvalidArgument);
  // Held version gone from the manifest (gc): the anchor path still works.
  Result<CatchUpPlan> after_gc = PlanCatchUp(m, 3, 6);
  ASSERT_TRUE(after_gc.ok());
  EXPECT_EQ(after_gc->steps.size(), 2u);
  // No anchor reachable: a clear kNotFound.
  Manifest broken;
  broken.versions.push_back(Entry(1, {AnchorObj(1, 10)}));
  broken.versions.push_back(Entry(2, {DeltaObj(2, 1, 1)}));
  broken.versions[0].objects.clear();  // (not a valid manifest; PlanCatchUp must not crash on it)
  Result<CatchUpPlan> none = PlanCatchUp(broken, 0, 2);
  EXPECT_EQ(none.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(none.status().message().find("no chain"), std::string::npos);
}

}  // namespace
}  // namespace deltasync
