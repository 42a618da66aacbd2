-- Quitting while commands run asks first (SPEC §8.4), as `:terminal` jobs do: while any run is
-- unfinished, a hidden buffer named after them is 'modified', so `:qa`, `:q` in the last window
-- and `ZZ` stop with "E162: No write since last change for buffer "agent-bash: 1 command
-- running (:qa! stops it)"" (`:confirm qa` asks); `:qa!` quits and the backend kills the
-- commands. Writing the buffer (`:wqa`) is refused the same way.

local M = {}
local H = {}

--- Sets the guard for `count` unfinished runs (0 lifts it).
---@param count integer
function M.update(count)
  if count == 0 then
    if H.buf and vim.api.nvim_buf_is_valid(H.buf) then
      vim.bo[H.buf].modified = false
    end
    return
  end
  local buf = H.ensure()
  local name = ('agent-bash: %d command%s running (:qa! stops %s)'):format(count, count == 1 and '' or 's', count == 1 and 'it' or 'them')
  pcall(vim.api.nvim_buf_set_name, buf, name)
  vim.bo[buf].modified = true
end

--- Whether the guard holds (some run is unfinished).
---@return boolean
function M.active()
  return H.buf ~= nil and vim.api.nvim_buf_is_valid(H.buf) and vim.bo[H.buf].modified
end

-- Helpers -----------------------------------------------------------------------------------

function H.ensure()
  if H.buf and vim.api.nvim_buf_is_valid(H.buf) then
    return H.buf
  end
  local buf = vim.api.nvim_create_buf(false, true)
  -- 'acwrite': a buffer Neovim checks for changes on quit (a 'nofile' one it does not)
  vim.bo[buf].buftype = 'acwrite'
  vim.bo[buf].bufhidden = 'hide'
  vim.bo[buf].swapfile = false
  vim.api.nvim_create_autocmd('BufWriteCmd', {
    buffer = buf,
    desc = 'agent-bash: commands are running; nothing to write',
    callback = function()
      vim.notify('agent-bash: commands are still running; :qa! stops them', vim.log.levels.WARN)
    end,
  })
  H.buf = buf
  return buf
end

return M
