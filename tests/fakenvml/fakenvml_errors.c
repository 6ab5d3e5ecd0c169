/* The fake's errors: the names its configuration uses (error=, fail=, init_error=) and the
 * strings real NVML returns for them (what nvidia-smi prints after "Failed to initialize NVML: "). */
#include <stdio.h>
#include <string.h>

#include "fakenvml.h"

static const struct { const char *name; nvmlReturn_t code; } ERRORS[] = {
    {"lost", NVML_ERROR_GPU_IS_LOST}, {"reset_required", NVML_ERROR_RESET_REQUIRED},
    {"no_permission", NVML_ERROR_NO_PERMISSION}, {"driver_not_loaded", NVML_ERROR_DRIVER_NOT_LOADED},
    {"lib_rm_mismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH}, {"not_supported", NVML_ERROR_NOT_SUPPORTED},
    {"in_use", NVML_ERROR_IN_USE}, {"invalid_argument", NVML_ERROR_INVALID_ARGUMENT},
    {"deprecated", NVML_ERROR_DEPRECATED}, {"insufficient_size", NVML_ERROR_INSUFFICIENT_SIZE},
    {"unknown", NVML_ERROR_UNKNOWN},
};

const char *error_name(nvmlReturn_t code) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == code) return ERRORS[i].name;
    return code ? "unknown" : "";
}

nvmlReturn_t error_code(const char *name) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (!strcmp(name, ERRORS[i].name)) return ERRORS[i].code;
    return name[0] ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
}

/* The strings real NVML returns (what nvidia-smi prints after "Failed to initialize NVML: "). */
const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_DEPRECATED: return "Requested functionality has been deprecated";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}
