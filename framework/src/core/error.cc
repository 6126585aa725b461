// The key functions of collie's exception types: their vtables and type_info are emitted
// here, in libcollie_core, and nowhere else.
#include "collie/error.h"

namespace collie {

Error::~Error() = default;
ConfigError::~ConfigError() = default;
PluginError::~PluginError() = default;
CommError::~CommError() = default;
CheckpointError::~CheckpointError() = default;
InternalError::~InternalError() = default;
TrainingError::~TrainingError() = default;

}  // namespace collie
