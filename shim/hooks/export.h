// export: the one attribute that makes a function one of lazypin's exported
// hooks. Every symbol that hooks/lazypin.map exports is defined with it, in
// hooks/; nothing outside hooks/ exports anything.
#pragma once

#define LAZYPIN_EXPORT extern "C" __attribute__((visibility("default")))
