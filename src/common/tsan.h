// DS_UNDER_TSAN: 1 in a ThreadSanitizer build (CMake's DS_TSAN; GCC's and
// clang's ways of saying so), else 0 (internal).
#pragma once

#if defined(__SANITIZE_THREAD__)
#define DS_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DS_UNDER_TSAN 1
#endif
#endif
#ifndef DS_UNDER_TSAN
#define DS_UNDER_TSAN 0
#endif
