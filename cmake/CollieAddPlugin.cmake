# collie_add_plugin(NAME <name> KIND backend|scheduler|model SOURCES <files...>
#                   [LIBRARIES <targets...>] [NO_INSTALL])
#
# Builds libcollie_<kind>_<name>.so: a MODULE library with hidden visibility that exports only
# the collie_plugin_v1 descriptor. Used in the collie tree and, through
# find_package(collie), by out-of-tree plugins.
function(collie_add_plugin)
  cmake_parse_arguments(ARG "NO_INSTALL" "NAME;KIND" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT ARG_NAME OR NOT ARG_KIND OR NOT ARG_SOURCES)
    message(FATAL_ERROR "collie_add_plugin: NAME, KIND and SOURCES are required")
  endif()
  if(NOT ARG_KIND MATCHES "^(backend|scheduler|model|codec)$")
    message(FATAL_ERROR "collie_add_plugin: KIND must be backend, scheduler, model or codec, not '${ARG_KIND}'")
  endif()
  if(NOT ARG_NAME MATCHES "^[a-z0-9_]+$")
    message(FATAL_ERROR "collie_add_plugin: NAME must match [a-z0-9_]+, not '${ARG_NAME}'")
  endif()
  set(target collie_${ARG_KIND}_${ARG_NAME})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE collie::core ${ARG_LIBRARIES})
  set_property(GLOBAL APPEND PROPERTY COLLIE_PLUGIN_TARGETS ${target})  # collie_main builds them
  string(TOUPPER "${ARG_KIND}" kind)
  set_property(GLOBAL APPEND PROPERTY COLLIE_${kind}_TARGETS ${target})  # and collie_schedulers
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "collie_${ARG_KIND}_${ARG_NAME}"
    CXX_STANDARD 17
    CXX_STANDARD_REQUIRED ON
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(COLLIE_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${COLLIE_PLUGIN_OUTPUT_DIR}")
  endif()
  # In the collie tree: the relative plugin folder of the install prefix. Out of tree: the
  # installed collie's plugin folder (COLLIE_PLUGIN_DIR, set by find_package(collie)).
  if(COLLIE_INSTALL_PLUGIN_DIR)
    set(destination "${COLLIE_INSTALL_PLUGIN_DIR}")
  else()
    set(destination "${COLLIE_PLUGIN_DIR}")
  endif()
  if(NOT ARG_NO_INSTALL AND destination)
    install(TARGETS ${target} LIBRARY DESTINATION "${destination}")
  endif()
endfunction()
